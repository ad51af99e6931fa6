"""Small random-weight model folders of different architectures, built offline, as a user would save them."""
from __future__ import annotations

import sysconfig
from pathlib import Path

# Qwen2-style ChatML: what `{"messages": ...}` lines are rendered with.
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def stdlib_text(name: str) -> str:
    return (Path(sysconfig.get_paths()["stdlib"]) / name).read_text()


def tokenizer(out: Path, chat: bool):
    """A byte-level BPE tokenizer (512 tokens) trained on a few stdlib files, saved to `out`."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / f).read_text() for f in ("textwrap.py", "string.py", "bisect.py", "colorsys.py")]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=512, special_tokens=specials, show_progress=False,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>" if chat else "<|endoftext|>",
                                   pad_token="<|endoftext|>", model_max_length=256)
    if chat:
        fast.chat_template = CHATML
    fast.save_pretrained(out)
    return fast


def build(out: Path, architecture: str) -> Path:
    """`LlamaForCausalLM` (no chat template) or `Qwen2ForCausalLM` (ChatML), hidden 64 x 2 layers, 256 positions."""
    import torch
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    chat = architecture.startswith("Qwen2")
    tok = tokenizer(out, chat)
    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config"))
    config = config_class(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                          tie_word_embeddings=True, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                          bos_token_id=None)
    torch.manual_seed(0)
    model = getattr(transformers, architecture)(config)
    with torch.no_grad():   # larger than the init's std 0.02, so greedy choices are not near-ties everywhere
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.2)
    model.save_pretrained(out, safe_serialization=True)
    return out


def encoder(out: Path) -> Path:
    """A sentence-transformers folder around a random `BertModel` (hidden 64 x 2 layers, WordPiece 512 tokens),
    mean pooling as all-MiniLM-L6-v2 does: modules.json and 1_Pooling/config.json."""
    import json

    import torch
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import BertConfig, BertModel, BertTokenizerFast

    out.mkdir(parents=True, exist_ok=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    texts = [(stdlib / f).read_text() for f in ("textwrap.py", "string.py", "bisect.py", "colorsys.py")]
    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"]
    tok = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tok.normalizer = normalizers.BertNormalizer(lowercase=True)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tok.decoder = decoders.WordPiece()
    tok.train_from_iterator(texts, trainers.WordPieceTrainer(vocab_size=512, special_tokens=specials,
                                                             show_progress=False))
    cls, sep = tok.token_to_id("[CLS]"), tok.token_to_id("[SEP]")
    tok.post_processor = processors.TemplateProcessing(single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
                                                       special_tokens=[("[CLS]", cls), ("[SEP]", sep)])
    fast = BertTokenizerFast(tokenizer_object=tok, unk_token="[UNK]", pad_token="[PAD]", cls_token="[CLS]",
                             sep_token="[SEP]", mask_token="[MASK]", model_max_length=128)
    fast.save_pretrained(out)
    config = BertConfig(vocab_size=len(fast), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                        num_attention_heads=4, max_position_embeddings=128, pad_token_id=0)
    torch.manual_seed(0)
    BertModel(config, add_pooling_layer=False).save_pretrained(out, safe_serialization=True)
    (out / "modules.json").write_text(json.dumps([
        {"idx": 0, "name": "0", "path": "", "type": "sentence_transformers.models.Transformer"},
        {"idx": 1, "name": "1", "path": "1_Pooling", "type": "sentence_transformers.models.Pooling"}]))
    (out / "1_Pooling").mkdir(exist_ok=True)
    (out / "1_Pooling" / "config.json").write_text(json.dumps({"word_embedding_dimension": 64,
                                                               "pooling_mode_mean_tokens": True}))
    return out
