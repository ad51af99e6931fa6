"""The roofline against the field guide's known answer (Llama-2-7B on an H100) and on this machine."""
import math

import pytest
from conftest import REPO
from omegaconf import OmegaConf
from transformers import AutoConfig, LlamaConfig

from experiments.analyse.roofline import Hardware, ModelShape, Roofline, phase_cost, plot, weight_and_kv_bytes

HARDWARE = REPO / "conf" / "hardware"
FP16, INT4 = 2.0, 0.5


def hardware(name: str) -> Hardware:
    return Hardware.from_conf(OmegaConf.load(HARDWARE / f"{name}.yaml"))


@pytest.fixture(scope="module")
def llama7b() -> ModelShape:
    return ModelShape.from_config(LlamaConfig(hidden_size=4096, num_hidden_layers=32, intermediate_size=11008,
                                              num_attention_heads=32, vocab_size=32000))


def test_shape_from_a_llama_config(llama7b):
    assert (llama7b.layers, llama7b.hidden, llama7b.intermediate) == (32, 4096, 11008)
    assert (llama7b.heads, llama7b.kv_heads, llama7b.head_dim, llama7b.vocab) == (32, 32, 128, 32000)
    assert not llama7b.tied_embeddings
    assert llama7b.params == pytest.approx(6.74e9, rel=0.01)   # Llama-2-7B's published count


def test_batch1_decode_is_memory_bound_on_h100(llama7b):
    # The guide: ~14 GB read and ~14 GFLOP per token, intensity ≈ 1, far below the H100's ridge ≈ 295.
    h100 = hardware("h100")
    decode = Roofline.analyse(llama7b, h100, FP16, FP16, prefill_tokens=2048, decode_batch=1, context=512).decode
    assert 12e9 < decode.cost.flops < 15e9
    assert 13e9 < decode.cost.bytes < 14e9
    assert decode.cost.intensity == pytest.approx(1.0, abs=0.1)
    assert h100.ridge == pytest.approx(295, abs=1)
    assert decode.bound == "memory"
    assert decode.attainable_flops == pytest.approx(decode.cost.intensity * h100.peak_bandwidth)
    # 13.5 GB at 3.35 TB/s: the familiar ~4 ms per token floor of a 7B fp16 model on one H100.
    assert decode.min_seconds_per_token == pytest.approx(decode.cost.bytes / h100.peak_bandwidth)


def test_long_prefill_is_compute_bound_on_h100(llama7b):
    # The guide: ~2.8e13 FLOP over ~14 GB, intensity ≈ 2000. Here the 2048 tokens' K/V writes add ~1 GB and
    # causal attention adds ~1e12 FLOP, which lands at ≈ 1970; counting activation traffic (left out, as the guide
    # does) could lower it by up to about half. Any of those is several times the ridge.
    prefill = Roofline.analyse(llama7b, hardware("h100"), FP16, FP16, 2048, 1, 512).prefill
    assert prefill.cost.flops == pytest.approx(2.8e13, rel=0.05)
    assert 1500 < prefill.cost.intensity < 2500
    assert prefill.bound == "compute"
    assert prefill.attainable_flops == hardware("h100").peak_flops


def test_int4_weights_raise_decode_intensity_about_4x(llama7b):
    # Only the weights shrink; the fp16 KV cache at a short context keeps the gain just under 4×.
    fp16 = phase_cost(llama7b, "decode", 1, 128, 1, FP16, FP16)
    int4 = phase_cost(llama7b, "decode", 1, 128, 1, INT4, FP16)
    assert 3.8 < int4.intensity / fp16.intensity <= 4.0
    prefill16 = phase_cost(llama7b, "prefill", 2048, 0, 1, FP16, FP16)
    prefill4 = phase_cost(llama7b, "prefill", 2048, 0, 1, INT4, FP16)
    assert prefill4.flops == prefill16.flops            # INT4 moves fewer bytes, it does not remove FLOPs


def test_batching_raises_decode_intensity_with_a_small_kv_cache(llama7b):
    one = phase_cost(llama7b, "decode", 1, 64, 1, FP16, FP16)
    eight = phase_cost(llama7b, "decode", 1, 64, 8, FP16, FP16)
    assert 7.5 < eight.intensity / one.intensity <= 8.0
    long_context = phase_cost(llama7b, "decode", 1, 4096, 8, FP16, FP16)
    # Each sequence's KV cache is read once per step, with no reuse across the batch: at 8 × 4096 tokens its
    # 17 GB outweigh the 13 GB of weights, and batching gains only about half as much.
    assert long_context.intensity / one.intensity < 5


def test_hardware_ridges_from_the_yamls():
    assert hardware("h100").ridge == pytest.approx(989 / 3.35, rel=1e-6)
    assert hardware("h200").ridge == pytest.approx(989 / 4.8, rel=1e-6)
    assert hardware("a100").ridge == pytest.approx(312 / 2.039, rel=1e-6)


def test_local_cpu_microbenchmark_gives_finite_peaks():
    node = OmegaConf.load(HARDWARE / "local-cpu.yaml")
    node.seconds = 0.2
    cpu = Hardware.from_conf(node)
    assert cpu.measured
    for value in (cpu.peak_flops, cpu.peak_bandwidth, cpu.ridge):
        assert math.isfinite(value) and value > 0


def test_weight_and_kv_bytes_of_a_recipe():
    assert weight_and_kv_bytes("fp32", "none") == (4.0, 4.0)
    assert weight_and_kv_bytes("fp16", "int4") == (0.5, 2.0)
    assert weight_and_kv_bytes("fp32", "int8") == (1.0, 4.0)
    assert weight_and_kv_bytes("bf16", "fp8") == (1.0, 2.0)      # an fp8 champion's diagnosis reads it too


def test_report_metrics_markdown_and_plot(llama7b, tmp_path):
    report = Roofline.analyse(llama7b, hardware("h100"), FP16, FP16, 2048, 1, 512)
    metrics = report.to_metrics()
    assert metrics["roofline/decode/memory_bound"] == 1.0 and metrics["roofline/prefill/memory_bound"] == 0.0
    assert all(isinstance(v, float) and math.isfinite(v) for v in metrics.values())
    assert all(k.replace("/", "").replace("_", "").isalnum() for k in metrics)   # MLflow-safe names
    assert "weight quantization (INT8/INT4) and batching raise decode throughput" in report.recommendation()
    assert "| decode" in report.to_markdown() and "memory-bound" in report.summary()
    fig = plot(report, tmp_path / "roofline.png")
    assert (tmp_path / "roofline.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(fig.axes[0].lines) >= 3   # the roof and the two phases


def test_tiny_builtin_model_analyses(model_dir, tmp_path):
    shape = ModelShape.from_config(AutoConfig.from_pretrained(model_dir))
    cpu = Hardware("this CPU", peak_flops=5e10, peak_bandwidth=1e10, cache_bytes=32 * 2 ** 20)
    report = Roofline.analyse(shape, cpu, *weight_and_kv_bytes("fp32", "none"), prefill_tokens=96,
                              decode_batch=1, context=160)
    assert shape.tied_embeddings and shape.params < 10e6
    # Its ~10 MB of fp32 weights fit in a 32 MB cache: DRAM bandwidth is not what limits its decode.
    assert report.decode.fits_in_cache and "not the limit" in report.recommendation()
    plot(report, tmp_path / "tiny.png")
    assert report.to_markdown()
