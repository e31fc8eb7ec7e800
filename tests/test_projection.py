"""The GPU projection: model arithmetic, roofline of one call, a whole trace, and calibration."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest

from benchmarks.perfmodel.calibration_fit import calibration_rows, fit_constants
from benchmarks.perfmodel.hardware import DEVICES, DREAM_7B, H200_SXM, LLADA2_MINI, LLADA_8B, MODELS, SDAR_8B
from benchmarks.perfmodel.moe import expected_experts_touched, scaled_experts_touched
from benchmarks.perfmodel.projection import (
    DEFAULT_SOURCE,
    Constants,
    default_constants,
    forward_cost,
    load_constants,
    project,
    save_constants,
    split_two_forwards,
)
from engine.scheduling.trace import ForwardRecord

DATASHEET_PEAKS = Constants(efficiency=1.0, bandwidth_efficiency=1.0, launch_overhead_s=0.0)


def window(rows: int, tokens: int = 32, context: int = 406) -> ForwardRecord:
    return ForwardRecord(window_rows=rows, window_tokens=tokens, window_context=context,
                         logit_positions=rows * 32, real_tokens=rows * context)


def refresh(rows: int, width: int = 406) -> ForwardRecord:
    return ForwardRecord(refresh_rows=rows, refresh_width=width, logit_positions=rows * 32,
                         real_tokens=rows * width)


def packed(refresh_rows: int, window_rows: int, width: int = 406) -> ForwardRecord:
    return ForwardRecord(refresh_rows=refresh_rows, refresh_width=width, window_rows=window_rows,
                         window_tokens=32, window_context=width,
                         logit_positions=(refresh_rows + window_rows) * 32,
                         real_tokens=(refresh_rows + window_rows) * width)


# --- model arithmetic (design doc section 7) --------------------------------------------------------

def test_llada_costs_about_15_gflop_per_forward_token():
    assert LLADA_8B.flops_per_token == pytest.approx(15e9, rel=0.1)  # 2 x (blocks + LM head)
    assert LLADA_8B.block_flops_per_token == pytest.approx(14e9, rel=0.01)  # what the projection charges


def test_llada_has_7b_block_params_and_a_half_billion_lm_head():
    assert LLADA_8B.block_params == pytest.approx(7.0e9, rel=0.01)
    assert LLADA_8B.lm_head_params == pytest.approx(0.52e9, rel=0.01)
    assert LLADA_8B.weight_bytes == pytest.approx(15.0e9, rel=0.01)  # bf16, embedding not streamed


def test_kv_cache_bytes_per_token():
    assert LLADA_8B.kv_bytes_per_token == 512 * 1024  # 32 layers x K,V x 4096 x 2 bytes
    assert DREAM_7B.kv_bytes_per_token == 56 * 1024  # GQA: 28 layers x K,V x 4 x 128 x 2 bytes


def test_every_model_fits_on_every_device():
    assert set(DEVICES) == {"h200", "h100", "a100"}
    assert set(MODELS) == {"llada-8b", "dream-7b", "sdar-8b", "llada2-mini"}
    for device in DEVICES.values():
        for model in MODELS.values():
            assert model.weight_bytes < device.memory_bytes


def test_block_causal_shapes_cache_their_kv_heads_and_count_every_expert():
    assert SDAR_8B.kv_bytes_per_token == 144 * 1024  # 36 layers x K,V x 8 x 128 x 2 bytes
    assert LLADA2_MINI.kv_bytes_per_token == 40 * 1024  # 20 layers x K,V x 4 x 128 x 2 bytes
    embeddings_and_head = 2 * LLADA2_MINI.lm_head_params  # the model card's "16B total, 1.4B active"
    assert LLADA2_MINI.block_params + embeddings_and_head == pytest.approx(16.3e9, rel=0.01)
    assert LLADA2_MINI.active_block_params + embeddings_and_head == pytest.approx(1.4e9, rel=0.03)


# --- one call ---------------------------------------------------------------------------------------

def test_one_row_window_step_is_memory_bound_and_pays_for_streaming_the_weights():
    cost = forward_cost(window(rows=1), LLADA_8B, H200_SXM)
    weights_s = LLADA_8B.weight_bytes / H200_SXM.bandwidth
    assert cost.bound == "memory"
    assert weights_s == pytest.approx(3.3e-3, rel=0.1)
    assert cost.time_s >= weights_s


def test_sixteen_row_refresh_of_400_tokens_is_compute_bound():
    cost = forward_cost(refresh(rows=16, width=400), LLADA_8B, H200_SXM)
    assert cost.bound == "compute"
    assert cost.time_s > 10 * cost.memory_s


def test_window_steps_cross_the_roofline_at_about_seven_rows():
    bounds = {rows: forward_cost(window(rows), LLADA_8B, H200_SXM, DATASHEET_PEAKS).bound
              for rows in range(1, 13)}
    assert all(bounds[rows] == "memory" for rows in range(1, 8))
    assert all(bounds[rows] == "compute" for rows in range(8, 13))


def test_attention_is_charged_at_each_parts_own_context():
    short, long = window(rows=4, context=200), window(rows=4, context=1200)
    extra = forward_cost(long, LLADA_8B, H200_SXM).flops - forward_cost(short, LLADA_8B, H200_SXM).flops
    assert extra == 4 * LLADA_8B.layers * LLADA_8B.hidden * (4 * 32) * 1000  # QK^T + AV, 1000 more keys


def test_split_two_forwards_keeps_every_row_token_and_logit():
    record = packed(refresh_rows=3, window_rows=5)
    refresh_part, window_part = split_two_forwards(record)
    assert (refresh_part.kind, window_part.kind) == ("refresh", "window")
    assert refresh_part.forward_tokens + window_part.forward_tokens == record.forward_tokens
    assert refresh_part.logit_positions + window_part.logit_positions == record.logit_positions
    assert refresh_part.real_tokens + window_part.real_tokens == record.real_tokens
    assert split_two_forwards(window(rows=2)) == (window(rows=2),)


def test_packing_streams_the_weights_once_and_saves_when_the_window_part_is_memory_bound():
    record = packed(refresh_rows=1, window_rows=2)
    whole = forward_cost(record, LLADA_8B, H200_SXM)
    parts = [forward_cost(part, LLADA_8B, H200_SXM) for part in split_two_forwards(record)]
    assert parts[1].bound == "memory"
    assert whole.flops == pytest.approx(sum(part.flops for part in parts))
    assert sum(part.bytes for part in parts) - whole.bytes == pytest.approx(LLADA_8B.weight_bytes)
    assert whole.time_s < sum(part.time_s for part in parts)


def test_an_moe_forward_reads_only_the_experts_it_touched():
    record, peaks = window(rows=1), DATASHEET_PEAKS
    few, every = (forward_cost(record, LLADA2_MINI, H200_SXM, peaks, experts=n) for n in (40, 256))
    assert every.bytes - few.bytes == (256 - 40) * 19 * LLADA2_MINI.expert_params * 2  # 19 MoE layers, bf16
    assert few.flops == every.flops and few.time_s < every.time_s  # a token multiplies through its 8 either way
    expected = forward_cost(record, LLADA2_MINI, H200_SXM, peaks, experts=expected_experts_touched(32, 256, 8))
    assert forward_cost(record, LLADA2_MINI, H200_SXM, peaks).bytes == expected.bytes  # no count: uniform routing
    assert project([record], 32, LLADA2_MINI, H200_SXM, peaks, experts=[40])["total_s"] == few.time_s


def test_expected_experts_of_uniform_routing_and_a_replay_models_count_carried_over():
    assert expected_experts_touched(1, 256, 8) == pytest.approx(8)
    assert expected_experts_touched(32, 256, 8) == pytest.approx(256 * (1 - (1 - 8 / 256) ** 32))
    assert scaled_experts_touched(77.0, 32, 256, 8, 256, 8) == pytest.approx(77.0)  # same routing: the count
    half_spread = scaled_experts_touched(0.5 * expected_experts_touched(5, 8, 2), 5, 8, 2, 256, 8)
    assert half_spread == pytest.approx(0.5 * expected_experts_touched(5, 256, 8))


def test_a_block_causal_trace_has_prefills_and_windows_and_no_refresh_cost():
    trace = [refresh(rows=4, width=128), window(4, tokens=8, context=132), window(4, tokens=4, context=132),
             packed(1, 3, 132)]
    result = project(trace, 64, SDAR_8B, H200_SXM, default_constants(H200_SXM))
    assert result["refresh_s"] == 0 and result["prefill_s"] > 0 and result["window_s"] > 0
    assert result["prefill_s"] + result["window_s"] == pytest.approx(result["total_s"])
    full_attention = project(trace, 64, dataclasses.replace(SDAR_8B, block_length=None), H200_SXM,
                             default_constants(H200_SXM))
    assert full_attention["total_s"] == result["total_s"] and full_attention["prefill_s"] == 0


# --- a trace ----------------------------------------------------------------------------------------

def static_batch_trace(blocks: int = 8, steps: int = 10) -> list[ForwardRecord]:
    return [record for _ in range(blocks) for record in [refresh(16)] + [window(16)] * steps]


def test_project_reports_tokens_per_second_and_mfu():
    result = project(static_batch_trace(), 1600, "llada-8b", "h200", default_constants(H200_SXM))
    assert result["calls"] == 88 and result["calls_by_kind"] == {"refresh": 8, "window": 80, "packed": 0}
    assert result["tokens_per_s"] == pytest.approx(1600 / result["total_s"])
    assert 0 < result["mfu"] <= 1
    assert result["refresh_s"] + result["window_s"] == pytest.approx(result["total_s"])
    assert result["mean_rows_per_forward"] == 16
    assert result["constants"]["source"] == DEFAULT_SOURCE


def test_project_without_packing_costs_each_packed_call_as_two():
    trace = [packed(refresh_rows=1, window_rows=3), window(rows=4)]
    together = project(trace, 100, LLADA_8B, H200_SXM, default_constants(H200_SXM))
    apart = project(trace, 100, LLADA_8B, H200_SXM, default_constants(H200_SXM), packed=False)
    assert together["calls_by_kind"] == {"refresh": 0, "window": 1, "packed": 1}
    assert apart["calls_by_kind"] == {"refresh": 1, "window": 2, "packed": 0}
    assert apart["total_s"] > together["total_s"]
    assert together["refresh_s"] + together["window_s"] == pytest.approx(together["total_s"])
    assert apart["flops"] == pytest.approx(together["flops"])


# --- calibration ------------------------------------------------------------------------------------

def synthetic_samples(truth: Constants, noise: float = 0.0) -> list[tuple[ForwardRecord, float]]:
    records = ([window(rows) for rows in (1, 2, 3, 4, 6, 12, 16, 32)]
               + [refresh(rows, width) for rows in (1, 4, 16) for width in (200, 406, 800)]
               + [packed(2, 6), packed(1, 1)])
    generator = np.random.default_rng(0)
    return [(record, forward_cost(record, LLADA_8B, H200_SXM, truth).time_s
             * (1 + noise * generator.standard_normal())) for record in records]


def test_fit_constants_recovers_the_constants_that_generated_the_samples():
    truth = Constants(efficiency=0.537, bandwidth_efficiency=0.812, launch_overhead_s=1.3e-3)
    fitted = fit_constants(synthetic_samples(truth), LLADA_8B, H200_SXM)
    assert fitted.efficiency == pytest.approx(truth.efficiency, abs=2e-4)
    assert fitted.bandwidth_efficiency == pytest.approx(truth.bandwidth_efficiency, abs=2e-4)
    assert fitted.launch_overhead_s == pytest.approx(truth.launch_overhead_s, rel=0.02)
    assert fitted.source.startswith("fit to 19 samples")


def test_fit_constants_tolerates_measurement_noise():
    truth = Constants(efficiency=0.42, bandwidth_efficiency=0.9, launch_overhead_s=2e-3)
    fitted = fit_constants(synthetic_samples(truth, noise=0.01), LLADA_8B, H200_SXM)
    assert fitted.efficiency == pytest.approx(truth.efficiency, rel=0.03)
    assert fitted.bandwidth_efficiency == pytest.approx(truth.bandwidth_efficiency, rel=0.03)


def test_constants_come_from_the_calibration_file_when_a_gpu_run_wrote_one(tmp_path):
    assert load_constants("h200", tmp_path) == default_constants(H200_SXM)
    samples = synthetic_samples(Constants(0.5, 0.8, 1e-3))
    fitted = fit_constants(samples, LLADA_8B, H200_SXM)
    path = save_constants(fitted, "h200", calibration_rows(samples, LLADA_8B, H200_SXM, fitted), tmp_path)
    stored = json.loads(path.read_text())
    assert stored["date"] and len(stored["rows"]) == len(samples)
    assert {"measured_s", "projected_s", "kind"} <= set(stored["rows"][0])
    loaded = load_constants("h200", tmp_path)
    assert loaded.efficiency == fitted.efficiency
    assert loaded.bandwidth_efficiency == fitted.bandwidth_efficiency
    assert loaded.source.startswith("calibrated")


def test_an_efficiency_no_sample_is_bound_by_stays_at_the_device_default():
    truth = Constants(efficiency=0.5, bandwidth_efficiency=0.7, launch_overhead_s=1e-3)
    compute_bound = [(record, seconds) for record, seconds in synthetic_samples(truth)
                     if forward_cost(record, LLADA_8B, H200_SXM, truth).bound == "compute"]
    fitted = fit_constants(compute_bound, LLADA_8B, H200_SXM)
    assert fitted.efficiency == pytest.approx(0.5, abs=1e-3)
    assert fitted.bandwidth_efficiency == pytest.approx(H200_SXM.bandwidth_efficiency, abs=1e-3)


# --- the host model -----------------------------------------------------------------------------------

def host(seconds_per_op: float, gap_s: float = 0.0):
    from benchmarks.perfmodel.host_model import HostModel

    return HostModel({"refresh": 200.0, "window": 150.0, "packed": 250.0},
                     {"refresh": 40.0, "window": 40.0, "packed": 55.0}, seconds_per_op, gap_s, "test")


def test_a_forward_costs_the_larger_of_gpu_and_host_time_plus_the_step_gap():
    slow_host = host(seconds_per_op=10e-6, gap_s=3e-4)  # 150 + 32 x 40 ops = 1430 ops: 14.3 ms
    cost = forward_cost(window(rows=1), LLADA_8B, H200_SXM, host=slow_host)
    assert cost.bound == "host"
    assert cost.host_s == pytest.approx(1430 * 10e-6)
    assert cost.time_s == pytest.approx(cost.host_s + 3e-4)
    big = forward_cost(refresh(rows=16), LLADA_8B, H200_SXM, host=slow_host)
    assert big.bound == "compute" and big.time_s == pytest.approx(big.gpu_s + 3e-4)


def test_packed_steps_pay_their_own_operation_count():
    model = host(seconds_per_op=1e-6)
    assert model.ops("packed", 32) == 250 + 32 * 55 > model.ops("window", 32)
    assert forward_cost(packed(1, 1), LLADA_8B, H200_SXM, host=model).host_s == pytest.approx(
        (250 + 32 * 55) * 1e-6)


def test_the_host_model_projection_counts_elementwise_and_logit_traffic():
    free_host = host(seconds_per_op=0.0)
    with_traffic = forward_cost(window(rows=16), LLADA_8B, H200_SXM, DATASHEET_PEAKS, host=free_host)
    roofline = forward_cost(window(rows=16), LLADA_8B, H200_SXM, DATASHEET_PEAKS)
    traffic = (16 * 32 * LLADA_8B.layers * LLADA_8B.hidden * DATASHEET_PEAKS.elementwise_bytes_per_hidden
               + 16 * 32 * LLADA_8B.vocab * DATASHEET_PEAKS.logit_bytes)
    assert with_traffic.bytes - roofline.bytes == pytest.approx(traffic)
    assert with_traffic.time_s == pytest.approx(roofline.time_s + traffic / H200_SXM.bandwidth)


def test_a_host_bound_trace_projects_lower_than_the_old_constant_overhead_says():
    trace = static_batch_trace()
    old = project(trace, 1600, "llada-8b", "h200", default_constants(H200_SXM))
    new = project(trace, 1600, "llada-8b", "h200", default_constants(H200_SXM), host=host(20e-6, 1e-3))
    assert new["host_bound_calls"] == 80 and new["calls"] == 88  # every window step waits for the host
    assert new["tokens_per_s"] < old["tokens_per_s"]
    assert new["host_model"]["source"] == "test" and old["host_model"] is None


def test_host_model_round_trips_through_its_calibration_file(tmp_path):
    from benchmarks.perfmodel import host_model

    model = host(7e-6, 2e-4)
    host_model.save(model, "cpu", tmp_path)
    assert host_model.load("cpu", tmp_path) == model
    assert host_model.load("h200", tmp_path) is None


def test_the_performance_model_loads_neither_torch_nor_the_engine():
    """The model is arithmetic on records and figures: the experiments, not the model, run the engine."""
    import subprocess
    import sys
    from pathlib import Path

    code = ("import benchmarks.perfmodel.projection, benchmarks.perfmodel.calibration_fit, "
            "benchmarks.perfmodel.sensitivity, sys; print(' '.join(sys.modules))")
    root = Path(__file__).resolve().parents[1]
    loaded = subprocess.run([sys.executable, "-c", code], cwd=root, capture_output=True, text=True,
                            check=True).stdout.split()
    assert not {"torch", "engine"} & {name.split(".")[0] for name in loaded}
    assert not [name for name in loaded if name.startswith("benchmarks.") and not name.startswith("benchmarks.perf")]
