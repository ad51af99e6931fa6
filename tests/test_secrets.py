"""Secrets never reach MLflow (the end-to-end sweep plants some too: tests/test_sweep_e2e.py)."""
from experiments.core.secrets import MASK, scrub_params, scrub_text, scrub_tree
from experiments.record.tracking import flatten


def test_url_passwords_and_token_shapes_are_masked():
    assert scrub_text("postgresql://roi:pa55w0rd@db:5432/mlflow") == f"postgresql://roi:{MASK}@db:5432/mlflow"
    assert scrub_text("https://user:tok@host/x and sqlite:///a/b.db") == f"https://user:{MASK}@host/x and sqlite:///a/b.db"
    token = "hf_" + "a1B2c3D4e5" * 3
    assert scrub_text(f"Authorization: Bearer {token}.") == f"Authorization: Bearer {MASK}."
    for shaped in ("ghp_" + "x" * 36, "sk-" + "Ab9_" * 6, "AKIA" + "ABCDEFGHIJKLMNOP"):
        assert shaped not in scrub_text(f"value {shaped} end")
    assert scrub_text("postgresql://u:p@ss@h/db") == f"postgresql://u:{MASK}@h/db"
    # as Hydra echoes an override, colons escaped
    assert scrub_text(r"uri=postgresql\://u\:pw@h\:5432/db x=1") == rf"uri=postgresql\://u\:{MASK}@h\:5432/db x=1"
    assert scrub_text("https://h/x?access_token=abcdef123456&n=1") == f"https://h/x?access_token={MASK}&n=1"
    assert scrub_text("host=db password=s3cretpw user=roi") == f"host=db password={MASK} user=roi"
    assert scrub_text("Authorization: Bearer eyJhbGciOi.J9.x") == f"Authorization: Bearer {MASK}"
    assert scrub_text("max_tokens=128 input_tokens=16") == "max_tokens=128 input_tokens=16"
    plain = "e2e_ms mean @c=8, ratio 0.795 [0.725, 0.906]; model /tmp/tiny-llm-b4b2f5d"
    assert scrub_text(plain) == plain


def test_environment_secrets_are_masked_wherever_they_appear(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "plantedvalue123")
    monkeypatch.setenv("MY_SERVICE_PASSWORD", "hunter2hunter2")
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "false")      # not a secret, and too short to mask anyway
    assert scrub_text("x plantedvalue123 y hunter2hunter2") == f"x {MASK} y {MASK}"
    assert scrub_text("false") == "false"


def test_secret_keys_are_masked_and_token_counts_are_not():
    cfg = {"target": {"hf_token": "abc", "workload": {"output_tokens": [16, 32], "max_tokens": 128}},
           "tracking": {"uri": "postgresql://u:p4ss@h/db", "password": "x", "api_key": None},
           "rung": {"max_tokens_per_step": 512}, "tokenizer": "bpe"}
    clean = scrub_tree(cfg)
    assert clean["target"]["hf_token"] == MASK and clean["tracking"]["password"] == MASK
    assert clean["tracking"]["api_key"] is None                 # nothing set, nothing to hide
    assert clean["tracking"]["uri"] == f"postgresql://u:{MASK}@h/db"
    assert clean["target"]["workload"] == cfg["target"]["workload"] and clean["rung"] == cfg["rung"]
    params = scrub_params(flatten(cfg))
    assert params["target.hf_token"] == MASK and params["target.workload.output_tokens.0"] == "16"
    assert params["rung.max_tokens_per_step"] == "512" and params["tokenizer"] == "bpe"
