"""The documents of SmolLM2's shipped task `smollm2_facts`: short facts a small instruct model knows, one fact per
document, each with its answer among four choices (chance 25 %).

Sized for the gate, not for a leaderboard: a harmless numerics change (int8 weights, another exact engine) flips a
few near-tie answers each way, and the paired drop's upper bound stays within a 0.02 tolerance only on a few hundred
documents (issue 34: on the 40 capitals alone no change that flips one answer could pass). Facts are independent
(no fact asked twice in other words), so the per-document differences are too.
"""
from __future__ import annotations

import random

CAPITALS = {
    "France": "Paris", "Germany": "Berlin", "Italy": "Rome", "Spain": "Madrid", "Portugal": "Lisbon",
    "Japan": "Tokyo", "China": "Beijing", "Russia": "Moscow", "Egypt": "Cairo", "Greece": "Athens",
    "Austria": "Vienna", "Hungary": "Budapest", "Poland": "Warsaw", "Sweden": "Stockholm", "Norway": "Oslo",
    "Finland": "Helsinki", "Denmark": "Copenhagen", "Ireland": "Dublin", "the United Kingdom": "London",
    "the Netherlands": "Amsterdam", "Belgium": "Brussels", "Czechia": "Prague", "Turkey": "Ankara",
    "India": "New Delhi", "Thailand": "Bangkok", "South Korea": "Seoul", "Indonesia": "Jakarta",
    "Argentina": "Buenos Aires", "Peru": "Lima", "Chile": "Santiago", "Colombia": "Bogotá", "Mexico": "Mexico City",
    "Canada": "Ottawa", "Australia": "Canberra", "Kenya": "Nairobi", "Cuba": "Havana", "Iran": "Tehran",
    "Iraq": "Baghdad", "Ukraine": "Kyiv", "Switzerland": "Bern", "Romania": "Bucharest", "Bulgaria": "Sofia",
    "Serbia": "Belgrade", "Croatia": "Zagreb", "Slovakia": "Bratislava", "Slovenia": "Ljubljana",
    "Lithuania": "Vilnius", "Latvia": "Riga", "Estonia": "Tallinn", "Iceland": "Reykjavik", "Albania": "Tirana",
    "Belarus": "Minsk", "Georgia": "Tbilisi", "Armenia": "Yerevan", "Syria": "Damascus", "Lebanon": "Beirut",
    "Jordan": "Amman", "Saudi Arabia": "Riyadh", "Afghanistan": "Kabul", "Pakistan": "Islamabad",
    "Nepal": "Kathmandu", "Bangladesh": "Dhaka", "Vietnam": "Hanoi", "the Philippines": "Manila",
    "Malaysia": "Kuala Lumpur", "Mongolia": "Ulaanbaatar", "North Korea": "Pyongyang", "Taiwan": "Taipei",
    "New Zealand": "Wellington", "Brazil": "Brasília", "Venezuela": "Caracas", "Ecuador": "Quito",
    "Bolivia": "La Paz", "Uruguay": "Montevideo", "Paraguay": "Asunción", "Jamaica": "Kingston",
    "Nigeria": "Abuja", "Ghana": "Accra", "Ethiopia": "Addis Ababa", "Morocco": "Rabat", "Algeria": "Algiers",
    "Tunisia": "Tunis", "Libya": "Tripoli", "Sudan": "Khartoum", "Senegal": "Dakar", "Uganda": "Kampala",
    "Zimbabwe": "Harare", "Angola": "Luanda", "Qatar": "Doha", "Israel": "Jerusalem", "Sri Lanka": "Colombo",
}
OPPOSITES = {
    "hot": "cold", "big": "small", "fast": "slow", "happy": "sad", "up": "down", "open": "closed",
    "light": "dark", "early": "late", "full": "empty", "hard": "soft", "high": "low", "long": "short",
    "old": "young", "rich": "poor", "strong": "weak", "wet": "dry", "thick": "thin", "loud": "quiet",
    "clean": "dirty", "true": "false", "win": "lose", "buy": "sell", "push": "pull",
    "begin": "end", "day": "night", "left": "right", "inside": "outside", "above": "below", "first": "last",
    "good": "bad", "safe": "dangerous", "cheap": "expensive", "wide": "narrow", "sweet": "sour",
    "friend": "enemy", "north": "south", "east": "west", "laugh": "cry", "love": "hate",
}


def docs(seed: int = 0) -> list[dict]:
    """Every family's documents, each answer among three distractors drawn with `seed`, in a drawn order (a
    task in order of family would let a first look speak for one family)."""
    rng = random.Random(seed)
    out = [*_capitals(rng), *_opposites(rng), *_neighbours(rng), *_sums(rng)]
    rng.shuffle(out)
    return out


def _doc(question: str, answer: str, others, rng: random.Random) -> dict:
    choices = rng.sample(sorted(set(others) - {answer}), 3) + [answer]
    rng.shuffle(choices)
    return {"question": f"Question: {question}\nAnswer:", "choices": choices, "label": choices.index(answer)}


def _capitals(rng):
    return [_doc(f"What is the capital of {country}?", capital, CAPITALS.values(), rng)
            for country, capital in CAPITALS.items()]


def _opposites(rng):
    words = set(OPPOSITES) | set(OPPOSITES.values())
    return [_doc(f"What is the opposite of \"{word}\"?", opposite, words - {word}, rng)
            for word, opposite in OPPOSITES.items()]


def _neighbours(rng):
    """The number after n (n = 1..99) and before it (n = 2..100): distractors near the answer, as a miscount
    would give, but never n itself (it is in the question)."""
    after = [_doc(f"What number comes after {n}?", str(n + 1), [str(n + d) for d in (-1, 2, 3, 10, 11)], rng)
             for n in range(1, 100)]
    before = [_doc(f"What number comes before {n}?", str(n - 1), [str(n + d) for d in (1, 2, -2, 9, 11)], rng)
              for n in range(2, 101)]
    return after + before


def _sums(rng):
    """a plus b for 1 <= a <= b <= 10 (one order each: 3 + 4 and 4 + 3 are one fact)."""
    return [_doc(f"What is {a} plus {b}?", str(a + b), [str(a + b + d) for d in (-2, -1, 1, 2, 10)], rng)
            for a in range(1, 11) for b in range(a, 11)]
