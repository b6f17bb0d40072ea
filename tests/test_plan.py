"""`elmo-jax plan`: the demo's train step compiled for an H200 without one, and what the plan
reads from it. Needs the compiler plugin (`elmo_jax[plan]`, Python 3.12+): skipped without it,
unless ELMO_JAX_REQUIRE_PLAN=1 (CI), where its absence fails."""

from __future__ import annotations

import json
import os
import re

import pytest
from cli import run_cli

from elmo_jax.model import softmax_kernels
from elmo_jax.plan import hlo
from elmo_jax.plan.kernels import Program, bitonic_passes, type_bytes
from elmo_jax.plan.program import largest_batch
from elmo_jax.plan.report import large_batch_note, wire_bytes
from elmo_jax.plan.targets import TARGETS


def _plugin_missing(tpu: bool) -> str | None:
    try:
        import jax_cuda12_plugin  # noqa: F401

        if tpu:
            import libtpu  # noqa: F401
    except ImportError:
        return "the plan's compiler plugins are not installed: pip install 'elmo_jax[plan]' (Python 3.12+)"
    return None


def _need_plugin(tpu: bool = False) -> None:
    missing = _plugin_missing(tpu)
    if missing:
        if os.environ.get("ELMO_JAX_REQUIRE_PLAN") == "1":
            pytest.fail(missing)
        pytest.skip(missing)


def _plan_demo(folder, devices: int, target: str = "h200", settings: tuple[str, ...] = ()) -> tuple[dict, str]:
    """The demo's step in bfloat16, 32 rows on each of `devices` chips of the target (and
    `settings`, `key=value` of config.train): the plan's JSON (--json=FILE) and the program
    (--hlo=FILE). With --json the summary alone is printed; the compile is logged as it starts."""
    _need_plugin(tpu=target.startswith("v"))
    program, figures = folder / "step.hlo", folder / "plan.json"
    args = ["plan", "--config=demo", f"--target={target}", f"--devices={devices}", "--vocab_size=2000", "--nofit"]
    args += [f"--hlo={program}", f"--json={figures}", "--config.train.per_device_batch_size=32"]
    args += ["--config.train.compute_dtype=bfloat16", *(f"--config.train.{setting}" for setting in settings)]
    result = run_cli(args, {"XDG_CACHE_HOME": str(folder / "cache")})
    assert result.returncode == 0, result.stderr
    assert f"{TARGETS[target].description} x {devices}, 32 rows per device" in result.stdout
    assert "{" not in result.stdout and f"compiling the train step for {devices} x " in result.stdout
    assert not list(folder.glob("cache/**/*-cache"))  # a program without its device cannot be loaded again
    return json.loads(figures.read_text()), program.read_text()


@pytest.fixture(scope="module")
def planned(tmp_path_factory):
    """The demo's step with XLA's LSTM cell and char CNN (a GPU's defaults are ours)."""
    return _plan_demo(tmp_path_factory.mktemp("plan"), 1, settings=("lstm_cell=xla", "char_conv=xla"))


@pytest.fixture(scope="module")
def planned_ours(tmp_path_factory):
    """The demo's step with a GPU's defaults: our LSTM cell and char CNN kernels."""
    return _plan_demo(tmp_path_factory.mktemp("plan_ours"), 1)


@pytest.fixture(scope="module")
def planned_fused(tmp_path_factory):
    """The demo's step with our LSTM cell, the gates' matmul inside the forward's kernel."""
    settings = ("lstm_schedule=wavefront", "lstm_cell=fused")
    return _plan_demo(tmp_path_factory.mktemp("plan_fused"), 1, settings=settings)


@pytest.fixture(scope="module")
def planned_v5e(tmp_path_factory):
    """The same step compiled for a TPU v5e by libtpu (its loops carry no trip count, its
    matmuls are convolutions, most of its arrays live in on-chip memory)."""
    return _plan_demo(tmp_path_factory.mktemp("plan_v5e"), 1, "v5e")


# The demo's sizes (experiments/demo.py): 2 layers, 2 directions, cell 128, projection 64.
L, D, C, P, B, T = 2, 2, 128, 64, 32, 20
CHAR_DIM, WIDTHS, CHARS = 8, [(1, 16), (2, 16), (3, 32), (4, 32)], 50  # char embedding, (width, filters), columns


@pytest.mark.slow
@pytest.mark.launches  # the fixture, made here
@pytest.mark.parametrize("compiled", ["planned", "planned_v5e"])
def test_plan_counts_the_lstm_loops_kernels_and_flops(compiled, request):
    plan, _ = request.getfixturevalue(compiled)
    lstm = [loop for loop in plan["kernels"]["loops"] if loop["matmul"]]
    assert plan["lstm_schedule"] == "wavefront"  # the accelerators' schedule, though compiled on a CPU
    assert [loop["trips"] for loop in lstm] == [T + L - 1] * 2  # forward and backward diagonals
    assert all(loop["trips_known"] for loop in plan["kernels"]["loops"])
    in_loops = sum(loop["trips"] * loop["kernels_per_iteration"] for loop in plan["kernels"]["loops"])
    assert plan["kernels"]["per_step"] == plan["kernels"]["outside_loops"] + in_loops
    # Each loop iteration, forward or backward: the gate matmul [x; h] (2P) -> 4C and the
    # projection C <-> P, for every layer, direction and row.
    per_iteration = 2 * L * D * B * (2 * P * 4 * C + C * P)
    assert plan["parts"]["LSTM loops"]["flops"] == 2 * (T + L - 1) * per_iteration


@pytest.mark.slow
@pytest.mark.launches
@pytest.mark.parametrize(("compiled", "target"), [("planned", "h200"), ("planned_v5e", "v5e")])
def test_plan_reports_memory_and_a_consistent_estimate(compiled, target, request):
    plan, _ = request.getfixturevalue(compiled)
    m, chip = plan["memory"], TARGETS[target]
    assert m["needs"] == m["argument"] + m["temp"] + m["output"] - m["alias"]
    assert 0 < m["needs"] < m["capacity"] == int(chip.memory_bytes * chip.usable_memory)
    assert plan["step_s"] >= max(plan["compute_floor_s"], plan["memory_floor_s"], plan["launches_s"])
    assert plan["tokens_per_s"] == pytest.approx(B * T / plan["step_s"])
    assert plan["paper_hours"] == pytest.approx(7.69e9 / plan["tokens_per_s"] / 3600)
    assert (plan["global_batch"], plan["recipe_global_batch"]) == (B, 384)
    e = plan["expected"]
    if chip.platform != "cuda":  # no rates measured on a TPU: the floor only, said so
        assert e is None
        return
    # The expected step: each class's floor at the H200's rates, the launches and the step's cost.
    assert e["step_s"] == pytest.approx(sum(e["by_class_s"].values()) + plan["collectives_s"])
    assert e["tokens_per_s"] == pytest.approx(B * T / e["step_s"])
    assert e["rates_from"] == "h200" and not e["borrowed"] and 0 < e["leave_one_out_worst"] <= 0.15
    assert len(e["furthest_above_floor"]) == 5


def test_plan_warns_of_a_global_batch_over_four_times_the_recipes():
    assert large_batch_note(4 * 384) == []  # 8 GPUs x 192 rows: no note
    (note,) = large_batch_note(8 * 512)
    assert note.startswith("note: 4,096 rows a step is 10.7x the paper's 384") and "lr_batch_scaling" in note


def test_a_program_larger_than_a_tpu_does_not_fit():
    """libtpu refuses to compile a program whose temporaries exceed the chip's memory (a GPU's
    compiler does not: its memory analysis tells): the plan says so, with the bytes it needs, so
    that the search for the largest batch takes it as a batch that does not fit."""
    _need_plugin(tpu=True)
    import jax
    import jax.numpy as jnp

    from elmo_jax.plan.program import DoesNotFit, abstract_devices, compile_within_memory

    v5e = TARGETS["v5e"]
    on_chip = jax.sharding.SingleDeviceSharding(abstract_devices(v5e, 1)[0])
    words = jax.ShapeDtypeStruct((80_000,), jnp.float32, sharding=on_chip)
    lowered = jax.jit(lambda x: jnp.sort(jnp.outer(x, x), axis=1)[:, :4].sum(), in_shardings=on_chip).lower(words)
    with pytest.raises(DoesNotFit, match="7 rows per device do not fit on v5e") as refused:
        compile_within_memory(lowered, v5e, 7)
    assert refused.value.needs_bytes >= 80_000**2 * 4 > v5e.memory_bytes  # at least the outer product


@pytest.mark.parametrize("name", sorted(TARGETS))
def test_each_target_is_the_chip_jax_names(name):
    """A target's description is the device_kind of its abstract chips, by which a measured run
    (benchmarks/speed/throughput.py) finds the estimate to print beside it."""
    _need_plugin(tpu=TARGETS[name].platform == "tpu")
    from elmo_jax.plan.program import abstract_devices
    from elmo_jax.plan.targets import for_device_kind

    (chip,) = abstract_devices(TARGETS[name], 1)
    assert chip.device_kind == TARGETS[name].description and for_device_kind(chip.device_kind) is TARGETS[name]


@pytest.mark.slow
def test_no_lstm_weight_is_converted_inside_a_loop(planned):
    """The bfloat16 weights are cast once per step, before the loops, not at every iteration:
    every conversion inside the LSTM loops is of an activation (B rows)."""
    _, text = planned
    program = Program(text)
    weights = set()
    for rows, cols in ((2 * P, 4 * C), (P, 4 * C), (C, P)):
        weights |= {(L, D, rows, cols), (L, D, cols, rows), (D, rows, cols), (D, cols, rows)}
    converted = []
    for loop in hlo.loops(text):
        if loop["matmul"]:
            for name in loop["computations"]:
                for inst in program.computations.get(name, []):
                    if inst.opcode == "convert":
                        converted.append(
                            tuple(int(d) for d in program.type(inst.operands[0]).split("[")[1].split("]")[0].split(","))
                        )
    assert converted, "no conversion found at all: the loops or the parsing changed"
    assert not [shape for shape in converted if shape in weights]


def _per_iteration(plan: dict, forward: bool) -> int:
    """The kernels an iteration of the plan's forward (or backward: a transpose's) LSTM loop runs."""
    (n,) = [n["kernels_per_iteration"] for n in plan["kernels"]["loops"] if ("transpose" in n["source"]) != forward]
    return n


@pytest.mark.slow
@pytest.mark.launches
def test_the_pallas_cell_runs_the_loops_in_few_kernels_counted_as_what_they_touch(planned, planned_ours):
    """With a GPU's default cell (lstm_cell=auto: ours, the wavefront being a GPU's default
    schedule) each LSTM loop runs two kernels of ours besides the loop's counter (forward: the
    cell; the projection with the outputs, their save slots and the next step's operand;
    backward: the gradient of o tanh(c), the cell's and gates' gradients; the output and input
    gradients and their slots) and one matmul, the gates' (their transpose backward: both
    projections are in our kernels), where XLA's cell takes 11 and 10 kernels: no copy of a
    buffer, no kernel adding a matmul's partial products. Each kernel counts the bytes it
    declares, not the slots' buffers whole, which it is passed: forward, the gates read, their
    activations written into their slot, the cell before the step read (from its slot) and the
    new one written into its slot, the projection's operand written into its slot only; then
    that slot and W_proj read, h read and written and into its slot, the inputs read, the
    outputs into their slot and the next step's operand written; backward, the projection's
    gradient and W_proj (each once) and the slot's activations read, the cell before the step
    read (from its slot: the one the step left is computed again, not read), the cell's
    gradient read and written in place, the gates' gradient written into its slot and for the
    matmul."""
    xla, _ = planned
    plan, text = planned_ours
    assert (plan["lstm_cell"], xla["lstm_cell"]) == ("pallas", "xla")
    # The projection's kernel has never run on a device: named so, with its products' FLOPs.
    assert plan["never_run"]["lstm_projection_and_output"] == (T + L - 1) * 2 * L * D * B * C * P
    assert "lstm_projection_and_output" not in plan["changed_since_measured"]
    program = Program(text)
    kernels = program.kernels()
    rows, bf16, f32 = L * D * B, 2, 4
    touched = {
        "lstm_forward_cell": rows * 4 * C * (bf16 + bf16) + rows * C * (f32 + f32 + bf16) + L * D * 4 * C * f32,
        "lstm_projection_and_output": rows * C * bf16 + L * D * C * P * bf16 + rows * P * 5 * f32 + rows * 2 * P * bf16,
        "lstm_backward_cell": rows * C * (f32 + 2 * f32) + (rows + L * D * C) * P * bf16 + rows * 4 * C * 3 * bf16,
        "lstm_backward_output": None,
    }
    for name, bytes_ in touched.items():
        ours = [k for k in kernels if name in k.source]
        assert len(ours) == 1 and ours[0].runs == T + L - 1 and ours[0].loop
        operands = program.defs[ours[0].name].operands
        assert ours[0].bytes < sum(type_bytes(program.type(o)) for o in operands) / 3  # not the slots whole
        if bytes_:
            assert ours[0].bytes == bytes_ + rows * 4  # and each row's mask
        assert not [
            k for k in kernels if k.loop == ours[0].loop and k.opcode == "copy" and k.bytes > 2 * f32 * rows * P
        ]

    # 2 kernels of ours, the gates' matmul and the counter each way (the projections in ours; no
    # kernel of XLA's adds a matmul's parts)
    assert _per_iteration(plan, True) == 4 < 11 <= _per_iteration(xla, True)
    assert _per_iteration(plan, False) == 4 < 10 <= _per_iteration(xla, False)
    assert plan["parts"]["LSTM loops"]["flops"] == xla["parts"]["LSTM loops"]["flops"]


@pytest.mark.slow
@pytest.mark.launches
def test_the_fused_cell_runs_the_gates_matmuls_inside_its_kernels(planned_ours, planned_fused):
    """With lstm_cell=fused the forward loop runs one kernel fewer: the gates' matmul is in the
    cell's kernel (that and the projection's kernel: no matmul of XLA's, the loop still the
    LSTM's); the backward as many (the gates' transposed matmul in the backward cell's kernel,
    where the pallas one has the projection's transpose). They declare the FLOPs of
    their products, which the plan counts as the matmuls' (the loops' FLOPs unchanged), and the
    bytes they move: forward, [inputs; h] and W once, where the matmul wrote the gates and the
    cell read them; backward, W once and the product's J partial sums written, where the cell
    wrote the gates' gradient for the matmul; besides what the cells moved."""
    from elmo_jax.model.cell_kernels import parts

    ours, _ = planned_ours
    plan, text = planned_fused
    assert plan["lstm_cell"] == "fused"
    kernels, their_kernels = Program(text).kernels(), Program(planned_ours[1]).kernels()
    rows, Q, bf16, f32 = L * D * B, 2 * P, 2, 4
    weights, J = L * D * Q * 4 * C * bf16, parts(C, rows * Q)
    (forward,) = [k for k in kernels if "lstm_gates_and_forward_cell" in k.source]
    (backward,) = [k for k in kernels if "lstm_backward_cell_and_gates_product" in k.source]
    (cell,) = [k for k in their_kernels if "lstm_forward_cell" in k.source]
    (cell_gradient,) = [k for k in their_kernels if "lstm_backward_cell" in k.source]
    for fused in forward, backward:
        assert fused.runs == T + L - 1 and fused.loop and fused.flops == 2 * rows * Q * 4 * C
    # The forward loop has no matmul of XLA's left, only ours: still counted as an LSTM loop's.
    assert {k.part for k in kernels if k.loop == forward.loop} == {"LSTM loops"}
    assert forward.bytes == cell.bytes - rows * 4 * C * bf16 + rows * Q * bf16 + weights
    # the fused kernel reads d_a where the pallas one reads the product's operands (d_h_raw, W_proj)
    d_a, projection = rows * C * bf16, (rows + L * D * C) * P * bf16
    assert backward.bytes == cell_gradient.bytes - projection + d_a - rows * 4 * C * bf16 + weights + J * rows * Q * f32

    assert (_per_iteration(plan, True), _per_iteration(plan, False)) == (3, 4)
    assert (_per_iteration(ours, True), _per_iteration(ours, False)) == (4, 4)
    assert plan["parts"]["LSTM loops"]["flops"] == ours["parts"]["LSTM loops"]["flops"]
    assert plan["parts"]["LSTM loops"]["bytes"] < ours["parts"]["LSTM loops"]["bytes"]


@pytest.mark.slow
def test_the_char_cnn_runs_as_bfloat16_matmuls(planned):
    """The char CNN's convolutions are one matmul of each position's characters by all filters:
    no cuDNN convolution (cuDNN has none with bfloat16 operands and float32 results; asked for
    one, XLA widened the operands to float32). The filters' gradient is one matmul too, of
    bfloat16 operands with a float32 result, so that its sums are float32."""
    _, text = planned
    program = Program(text)
    kernels = program.kernels()
    assert not [k for k in kernels if k.opcode == "custom-call" and "conv" in k.name]
    filter_gradients = [k for k in kernels if "nwk,nwf->kf" in k.source and k.flops]  # not split-K sums
    assert len(filter_gradients) == 1 and {k.dtype for k in filter_gradients} == {"bf16"}
    assert all(program.defs[k.name].type.startswith("f32[") for k in filter_gradients)


@pytest.mark.slow
@pytest.mark.launches
def test_our_char_cnn_kernels_keep_the_convolutions_values_on_chip(planned, planned_ours):
    """With a GPU's default char CNN (char_conv=auto: ours), the convolutions with their max and
    its bits, and the two products of the backward pass, are three kernels of ours, each counted
    as the bytes and bfloat16 FLOPs it declares. No (words, positions, filters) array is left in
    the program: the token encoder moves a fraction of the bytes of XLA's path."""
    (xla, xla_text), (plan, text) = planned, planned_ours
    assert (plan["char_conv"], xla["char_conv"]) == ("pallas", "xla")
    kernels = Program(text).kernels()
    for name in ("char_cnn_max", "char_cnn_character_gradients", "char_cnn_filter_gradients"):
        (ours,) = [k for k in kernels if name in k.source]
        assert ours.dtype == "bf16" and ours.flops > 0 and ours.bytes > 0

    def convolved(program: str) -> set:  # the shapes of (words, positions, filters) arrays
        shapes = {tuple(int(d) for d in dims.split(",")) for dims in re.findall(r"\[([\d,]+)\]", program)}
        return {shape for shape in shapes if shape[-2:] == (CHARS, sum(n for _, n in WIDTHS))}

    assert convolved(xla_text) and not convolved(text)
    assert plan["parts"]["token_encoder"]["bytes"] < xla["parts"]["token_encoder"]["bytes"] / 2


@pytest.mark.launches
def test_gradients_are_summed_over_devices_in_float32(tmp_path):
    """With bfloat16 matmuls, every floating-point all-reduce of the 2-device step (the
    gradients, the token vectors' gradient, the losses) sums float32 values."""
    plan, text = _plan_demo(tmp_path, 2)
    reductions = [i for i in Program(text).defs.values() if i.opcode in ("all-reduce", "all-reduce-start")]
    dtypes = {dtype for i in reductions for dtype in re.findall(r"(\w+)\[", i.type)}
    assert reductions and plan["collective_bytes"]["all-reduce"] > 0
    assert {dtype for dtype in dtypes if dtype[0] in "fb"} == {"f32"}, dtypes


@pytest.mark.slow
def test_the_lstm_buffers_are_not_zero_filled(planned):
    """Every slot of the buffers the LSTM loops save into is written before it is read: they
    are allocated uninitialised (launching nothing), not filled with zeros first."""
    _, text = planned
    program = Program(text)
    allocated = [i for i in program.defs.values() if 'custom_call_target="AllocateBuffer"' in i.attrs]
    # 7 here: forward projections, gates, cells, inputs; backward d_gates, d_h_raw, input gradients
    assert len(allocated) >= 5
    assert not {i.name for i in allocated} & {k.name for k in program.kernels()}


ASYNC_SLICE = """
%fused_slice (p0: f32[20,2,512,64], p1: s32[]) -> f32[1,2,512,64] {
  %p0 = f32[20,2,512,64]{3,2,1,0} parameter(0)
  %p1 = s32[] parameter(1)
  %z = s32[] constant(0)
  ROOT %ds = f32[1,2,512,64]{3,2,1,0} dynamic-slice(%p0, %p1, %z, %z, %z), dynamic_slice_sizes={1,2,512,64}
}

ENTRY %main (a: f32[20,2,512,64], i: s32[]) -> f32[1,2,512,64] {
  %a = f32[20,2,512,64]{3,2,1,0} parameter(0)
  %i = s32[] parameter(1)
  %start = ((f32[20,2,512,64], s32[]), f32[1,2,512,64]{3,2,1,0}, u32[]) fusion-start(%a, %i), calls=%fused_slice
  ROOT %done = f32[1,2,512,64]{3,2,1,0} fusion-done(%start)
}
"""


def test_an_async_fusion_is_one_kernel_that_reads_only_its_slice():
    """XLA's GPU compiler wraps some loop fusions in fusion-start / fusion-done: one kernel,
    whose bytes are the wrapped fusion's (the slice read and written), not its tuple's."""
    (kernel,) = Program(ASYNC_SLICE).kernels()
    assert kernel.opcode == "fusion-start" and kernel.runs == 1 and kernel.kind == "elementwise"
    assert kernel.bytes == 2 * (2 * 512 * 64 * 4) + 4


# A Pallas kernel compiled for a TPU (Mosaic): its metadata one JSON key a line, unescaped.
TPU_KERNEL = """
ENTRY %main (a: bf16[50,256,128], b: bf16[128,512]) -> f32[256,512] {
  %a = bf16[50,256,128]{2,1,0:T(8,128)(2,1)} parameter(0)
  %b = bf16[128,512]{1,0:T(8,128)(2,1)} parameter(1)
  ROOT %char_cnn_max.1 = f32[256,512]{1,0:T(8,128)} custom-call(%a, %b), custom_call_target="tpu_custom_call", \
frontend_attributes={kernel_metadata={
"elmo_jax.bytes":"4000",
"elmo_jax.flops":"9000"
}}, metadata={op_name="jit(train_step)/jvp(token_encoder)/char_cnn_max/pallas_call"}
}
"""


def test_a_tpu_pallas_kernel_is_counted_as_the_bytes_and_flops_it_declares():
    """A TPU program's text spreads a Pallas kernel's metadata over lines: they are its instruction's,
    its bytes and FLOPs read from them and its JAX op from the line after."""
    (kernel,) = Program(TPU_KERNEL, "tpu").kernels()
    assert (kernel.kind, kernel.bytes, kernel.flops, kernel.part) == ("pallas", 4000, 9000, "token_encoder")
    assert kernel.source.endswith("char_cnn_max/pallas_call")


# (its backend config as XLA writes it, shortened to the fields read)
_GEMM = 'custom_call_target="__cublas$lt$matmul", backend_config={"gemm_backend_config":{"dot_dimension_numbers":'
CUBLAS_MATMUL = f"""
ENTRY %main (a: bf16[8,64,256], b: bf16[256,128]) -> (bf16[512,128], s8[1024]) {{
  %a = bf16[8,64,256]{{2,1,0}} parameter(0)
  %f = bf16[512,256]{{1,0}} bitcast(%a)
  %b = bf16[256,128]{{1,0}} parameter(1)
  ROOT %c = (bf16[512,128]{{1,0}}, s8[1024]{{0}}) custom-call(%f, %b), {_GEMM}{{"lhs_contracting_dimensions":["1"]}}}}}}
}}
"""


def test_a_cublas_matmul_counts_its_flops():
    """Autotuning on the device, XLA runs some matmuls as cuBLAS calls (custom calls whose
    contracting dimensions are in their backend config): 2 x result elements x contracted size,
    as the dot they replace (an instruction copied from a compiled H200 program)."""
    (kernel,) = Program(CUBLAS_MATMUL).kernels()
    assert kernel.opcode == "custom-call" and kernel.dtype == "bf16" and kernel.kind == "matmul"
    assert kernel.flops == 2 * 512 * 128 * 256


REDUCED_SLICE = """
%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%fused_slice (p: f32[16,112,2048]) -> f32[48,64] {
  %p = f32[16,112,2048]{2,1,0} parameter(0)
  %zero = f32[] constant(0)
  %sum = f32[112,2048]{1,0} reduce(%p, %zero), dimensions={0}, to_apply=%add
  ROOT %filter = f32[48,64]{1,0} slice(%sum), slice={[0:48], [64:128]}
}

ENTRY %main (x: f32[16,112,2048]) -> f32[48,64] {
  %x = f32[16,112,2048]{2,1,0} parameter(0)
  ROOT %f = f32[48,64]{1,0} fusion(%x), kind=kLoop, calls=%fused_slice
}
"""


def test_a_fusion_that_slices_what_it_computes_reads_only_that_share():
    """The char CNN's filter gradients: each filter's block sliced out of the split-K partial
    sums of all filters' gradient, one kernel a filter, each reducing only its block."""
    (kernel,) = Program(REDUCED_SLICE).kernels()
    assert kernel.bytes == 16 * 48 * 64 * 4 + 48 * 64 * 4
    assert kernel.kind == "reduction"  # its class for the measured rates (plan/rates.py)


SORT = """
%compare (a: f32[], b: f32[], i: s32[], j: s32[]) -> pred[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  %i = s32[] parameter(2)
  %j = s32[] parameter(3)
  ROOT %gt = pred[] compare(%a, %b), direction=GT
}

%fused_sort (p0: f32[793471], p1: s32[793471]) -> (f32[793471], s32[793471]) {
  %p0 = f32[793471]{0} parameter(0)
  %p1 = s32[793471]{0} parameter(1)
  ROOT %sort = (f32[793471]{0}, s32[793471]{0}) sort(%p0, %p1), dimensions={0}, to_apply=%compare
}

ENTRY %main (x: f32[793471], i: s32[793471]) -> (f32[793471], s32[793471]) {
  %x = f32[793471]{0} parameter(0)
  %i = s32[793471]{0} parameter(1)
  ROOT %sorted = (f32[793471]{0}, s32[793471]{0}) fusion(%x, %i), kind=kInput, calls=%fused_sort
}
"""


def test_a_sort_is_a_kernel_per_pass_of_xlas_bitonic_sort():
    """XLA's GPU sort of 793,471 (the sampler's top_k before model/top_k.py): 2^20 elements in 20
    stages; the masks of the first 12 stages (tiles of 4,096) in one kernel, then in each stage
    i = 12..19 its i - 11 masks of 4,096 or more one kernel each and its smaller ones one more."""
    assert bitonic_passes(793_471) == 1 + sum(i - 10 for i in range(12, 20)) == 45
    assert [bitonic_passes(n) for n in (1, 4096, 4097, 8192, 8193)] == [1, 1, 3, 3, 6]
    (kernel,) = Program(SORT).kernels()
    assert kernel.runs == 45 and kernel.bytes == 2 * 793_471 * 8  # each pass reads and writes both arrays
    assert kernel.kind == "sort"


def test_a_reduce_scatter_and_an_all_gather_send_what_an_all_reduce_sends():
    """Ring collectives on n devices: an all-reduce of S bytes is a reduce-scatter (results of
    S / n) followed by an all-gather (result S), and sends 2 (n - 1) / n x S."""
    n, S = 8, 8_000
    assert wire_bytes("all-reduce", S, n) == pytest.approx(2 * (n - 1) / n * S)
    assert wire_bytes("reduce-scatter", S / n, n) + wire_bytes("all-gather", S, n) == pytest.approx(
        wire_bytes("all-reduce", S, n)
    )
    assert wire_bytes("all-reduce", S, 1) == 0


def test_largest_batch_is_bracketed_by_compiled_sizes():
    capacity = 10_000
    compiled = []

    def needs(rows: int) -> int:  # a fixed part and a slightly convex per-row part
        compiled.append(rows)
        return 1_000 + 30 * rows + rows * rows // 100

    known = {64: needs(64)}
    best = largest_batch(needs, capacity, known)
    assert needs(best) <= capacity < needs(best + 8) and best % 8 == 0
    assert best in known and best + 8 in known  # found by compiling both sides, not guessed
    assert len(known) <= 8
    assert largest_batch(lambda rows: capacity + 1, capacity, {}) == 0
    assert largest_batch(lambda rows: 1, capacity, {}, limit=1024) == 1024


def test_largest_batch_search_survives_memory_that_bends():
    """Memory per row that grows past some batch (XLA rematerialises less there): the line
    through the small compiled sizes overshoots, and the line from there must not creep to the
    answer a multiple at a time (it took 563 compiles of the real step's shape before)."""
    capacity = 113e9

    def needs(rows: int) -> float:  # the H200 step's shape: 4.2 GB fixed, 9 then 14.3 MB a row
        return 4.2e9 + (9e6 if rows < 2000 else 14.3e6) * rows

    known = {512: needs(512)}
    best = largest_batch(needs, capacity, known)
    assert needs(best) <= capacity < needs(best + 8) and {best, best + 8} <= set(known)
    assert len(known) <= 12, sorted(known)


@pytest.mark.launches
def test_plan_of_embedding_counts_every_matmul_of_its_programs():
    """`plan --mode=embed`: the LSTM window runs WINDOW + L - 1 diagonals of every layer and
    direction over the batch's rows; the token encoder multiplies each position of 2048 words of
    50 characters by every filter (one matmul of the widest filter's windows: narrower filters'
    weights padded with zeros) and runs the highway layer and the projection on each word."""
    _need_plugin()
    result = run_cli(["plan", "--config=demo", "--target=h200", "--mode=embed", "--batch_size=24", "--devices=2"])
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    window, encoder = plan["programs"]["LSTM window"], plan["programs"]["token encoder"]
    rows = 12  # per device: 24 rows over 2 devices
    assert (plan["rows"], plan["window"], plan["lstm_schedule"]) == (24, 8, "wavefront")
    assert window["flops"] == 2 * rows * (8 + L - 1) * L * D * (2 * P * 4 * C + C * P)
    F = sum(n for _, n in WIDTHS)
    widths = [w for w, _ in WIDTHS]
    conv = (CHARS - min(widths) + 1) * max(widths) * CHAR_DIM * F
    assert encoder["flops"] == 2 * 1024 * (conv + F * 2 * F + F * P)
    assert plan["positions_per_s"] == pytest.approx(24 * 8 / window["seconds"])
    assert plan["words_per_s"] == pytest.approx(2048 / encoder["seconds"])
    assert 0 < window["memory"]["argument"] and "at the floors:" in result.stdout


# A TPU program's loop, as libtpu writes it: no known_trip_count (the trips are read from the
# counter: from 0 while < 21, + 1 a turn), scalar counter arithmetic beside the kernels, and
# the loop's state in on-chip memory (S(1)); only the weights are in HBM.
TPU_LOOP = """
%cond (p: (s32[], f32[8,128], bf16[128,128])) -> pred[] {
  %cond_state = (s32[]{:T(128)}, f32[8,128]{1,0:T(8,128)S(1)}, bf16[128,128]{1,0:T(8,128)(2,1)}) parameter(0)
  %cond_index = s32[]{:T(128)} get-tuple-element(%cond_state), index=0
  %limit = s32[]{:T(128)} constant(21)
  ROOT %lt = pred[]{:T(512)} compare(%cond_index, %limit), direction=LT
}

%fused_step (step_h: f32[8,128], step_w: bf16[128,128]) -> f32[8,128] {
  %step_h = f32[8,128]{1,0:T(8,128)S(1)} parameter(0)
  %step_w = bf16[128,128]{1,0:T(8,128)(2,1)} parameter(1)
  %step_x = bf16[8,128]{1,0:T(8,128)(2,1)} convert(%step_h)
  ROOT %step_d = f32[8,128]{1,0:T(8,128)S(1)} dot(%step_x, %step_w), lhs_contracting_dims={1}, rhs_contracting_dims={0}
}

%body (p: (s32[], f32[8,128], bf16[128,128])) -> (s32[], f32[8,128], bf16[128,128]) {
  %state = (s32[]{:T(128)}, f32[8,128]{1,0:T(8,128)S(1)}, bf16[128,128]{1,0:T(8,128)(2,1)}) parameter(0)
  %index = s32[]{:T(128)} get-tuple-element(%state), index=0
  %counter = s32[]{:T(128)S(6)} copy(%index)
  %one = s32[]{:T(128)} constant(1)
  %next = s32[]{:T(128)} add(%counter, %one)
  %state_h = f32[8,128]{1,0:T(8,128)S(1)} get-tuple-element(%state), index=1
  %state_w = bf16[128,128]{1,0:T(8,128)(2,1)} get-tuple-element(%state), index=2
  %h2 = f32[8,128]{1,0:T(8,128)S(1)} fusion(%state_h, %state_w), kind=kOutput, calls=%fused_step
  ROOT %t = (s32[]{:T(128)}, f32[8,128]{1,0:T(8,128)S(1)}, bf16[128,128]{1,0:T(8,128)(2,1)}) tuple(%next, %h2, %state_w)
}

ENTRY %main (h: f32[8,128], w: bf16[128,128]) -> f32[8,128] {
  %h = f32[8,128]{1,0:T(8,128)} parameter(0)
  %w = bf16[128,128]{1,0:T(8,128)(2,1)} parameter(1)
  %zero = s32[]{:T(128)} constant(0)
  %init = (s32[]{:T(128)}, f32[8,128]{1,0:T(8,128)S(1)}, bf16[128,128]{1,0:T(8,128)(2,1)}) tuple(%zero, %h, %w)
  %loop = (s32[], f32[8,128], bf16[128,128]) while(%init), condition=%cond, body=%body
  ROOT %out = f32[8,128]{1,0:T(8,128)} get-tuple-element(%loop), index=1
}
"""


def test_a_tpu_loop_runs_as_often_as_its_counter_says_and_reads_only_hbm():
    program = Program(TPU_LOOP, "tpu")
    (loop,) = program.loops()
    assert (loop.trips, loop.known, loop.matmul) == (21, True, True)
    (kernel,) = program.kernels()  # the counter's copy and add run on the scalar unit
    assert (kernel.name, kernel.runs, kernel.loop) == ("h2", 21, "body")
    assert (kernel.flops, kernel.dtype) == (2 * 8 * 128 * 128, "bf16")
    assert kernel.bytes == 128 * 128 * 2  # the weights; the state in on-chip memory costs no HBM traffic
    # Read as a GPU's program, the same scalars are kernels of their own (the GPU has no scalar unit).
    assert sorted(k.name for k in Program(TPU_LOOP, "cuda").kernels()) == ["counter", "h2", "next"]


@pytest.mark.parametrize(
    ("direction", "start", "limit", "step", "trips"),
    [("LT", 0, 21, 1, 21), ("LE", 0, 21, 1, 22), ("LT", 0, 21, 4, 6), ("GT", 20, -1, -1, 21), ("NE", 0, 21, 3, 7)],
)
def test_a_loops_trip_count_is_read_from_its_counter(direction, start, limit, step, trips):
    text = TPU_LOOP.replace("constant(21)", f"constant({limit})").replace("direction=LT", f"direction={direction}")
    text = text.replace("%zero = s32[]{:T(128)} constant(0)", f"%zero = s32[]{{:T(128)}} constant({start})")
    text = text.replace("%one = s32[]{:T(128)} constant(1)", f"%one = s32[]{{:T(128)}} constant({step})")
    assert Program(text, "tpu").loops()[0].trips == trips


# Convolutions as a TPU program writes matmuls: a batched matmul over (layer, direction) as a
# convolution whose 2x2 window meets a 2x2 input dilated by 2 only on its diagonal (one tap per
# output position), and a padded 1-D convolution (a weight gradient: the window slides past the
# input's ends).
CONVOLUTIONS = """
ENTRY %m (x: bf16[2,2,32,128], w: bf16[2,2,128,512], a: f32[8,5,16], k: f32[3,16,4]) -> (bf16[2,2,32,512], f32[8,7,4]) {
  %x = bf16[2,2,32,128]{3,2,1,0:T(8,128)(2,1)} parameter(0)
  %w = bf16[2,2,128,512]{3,2,1,0:T(8,128)(2,1)} parameter(1)
  %a = f32[8,5,16]{2,1,0} parameter(2)
  %k = f32[3,16,4]{2,1,0} parameter(3)
  %batched = bf16[2,2,32,512]{3,2,1,0} convolution(%x, %w), window={size=2x2 lhs_dilate=2x2}, dim_labels=01bf_01io->01bf
  %padded = f32[8,7,4]{2,1,0} convolution(%a, %k), window={size=3 pad=2_2}, dim_labels=b0f_0io->b0f
  ROOT %t = (bf16[2,2,32,512], f32[8,7,4]) tuple(%batched, %padded)
}
"""


def test_a_convolution_counts_the_products_that_meet_its_input():
    batched, padded = Program(CONVOLUTIONS, "tpu").kernels()
    assert batched.flops == 2 * (2 * 2) * 32 * 128 * 512  # 4 matmuls of 32 x 128 by 128 x 512
    assert padded.flops == 2 * 8 * 4 * 16 * 5 * 3  # each input position meets each of the 3 taps once


# A TPU loop's fusions: one writes a time slot of a saved buffer in place and also returns the
# new cell state (kept on chip); one hands the saved buffer whole to a fusion nested in it,
# which reads one time slot of it.
SLOTS = """
%write_slot (buffer: f32[4,21,256], t: s32[], c: f32[4,256]) -> (f32[4,21,256], f32[4,256]) {
  %buffer = f32[4,21,256]{2,0,1:T(8,128)} parameter(0)
  %t = s32[]{:T(128)} parameter(1)
  %c = f32[4,256]{1,0:T(8,128)S(1)} parameter(2)
  %c2 = f32[4,256]{1,0:T(8,128)S(1)} multiply(%c, %c)
  %slot = f32[4,1,256]{2,0,1:T(8,128)} bitcast(%c2)
  %zero = s32[]{:T(128)} constant(0)
  %saved = f32[4,21,256]{2,0,1:T(8,128)} dynamic-update-slice(%buffer, %slot, %zero, %t, %zero)
  ROOT %both = (f32[4,21,256]{2,0,1:T(8,128)}, f32[4,256]{1,0:T(8,128)S(1)}) tuple(%saved, %c2)
}

%read_slot (gates: bf16[4,21,1024], i: s32[]) -> bf16[4,1024] {
  %gates = bf16[4,21,1024]{2,0,1:T(8,128)(2,1)} parameter(0)
  %i = s32[]{:T(128)} parameter(1)
  %z = s32[]{:T(128)} constant(0)
  %one = bf16[4,1,1024]{2,0,1:T(8,128)(2,1)} dynamic-slice(%gates, %z, %i, %z), dynamic_slice_sizes={4,1,1024}
  ROOT %flat = bf16[4,1024]{1,0:T(8,128)(2,1)} bitcast(%one)
}

%gradient (w: bf16[256,1024], g: bf16[4,21,1024], s: s32[]) -> f32[4,256] {
  %w_in = bf16[256,1024]{1,0:T(8,128)(2,1)} parameter(0)
  %g_in = bf16[4,21,1024]{2,0,1:T(8,128)(2,1)} parameter(1)
  %s_in = s32[]{:T(128)} parameter(2)
  %d_gates = bf16[4,1024]{1,0:T(8,128)(2,1)} fusion(%g_in, %s_in), kind=kLoop, calls=%read_slot
  ROOT %d_h = f32[4,256]{1,0:T(8,128)S(1)} dot(%d_gates, %w_in), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

ENTRY %e (b: f32[4,21,256], t: s32[], c: f32[4,256], w: bf16[256,1024], g: bf16[4,21,1024]) -> f32[4,256] {
  %b_e = f32[4,21,256]{2,0,1:T(8,128)} parameter(0)
  %t_e = s32[]{:T(128)} parameter(1)
  %c_e = f32[4,256]{1,0:T(8,128)S(1)} parameter(2)
  %w_e = bf16[256,1024]{1,0:T(8,128)(2,1)} parameter(3)
  %g_e = bf16[4,21,1024]{2,0,1:T(8,128)(2,1)} parameter(4)
  %state = (f32[4,21,256]{2,0,1:T(8,128)}, f32[4,256]{1,0:T(8,128)S(1)}) fusion(%b_e, %t_e, %c_e), calls=%write_slot
  ROOT %back = f32[4,256]{1,0:T(8,128)S(1)} fusion(%w_e, %g_e, %t_e), kind=kOutput, calls=%gradient
}
"""


def test_a_slot_written_beside_another_result_and_a_slot_read_by_a_nested_fusion_count_the_slot():
    """The original size's v5e loops read as 23.6 GB a step before: each slot write counted its
    whole buffer read and written (the fusion has a second result), and the backward's matmul
    its whole saved gates (sliced in a nested fusion): 8.4 GB."""
    write, read = Program(SLOTS, "tpu").kernels()
    assert write.bytes == 4 * 256 * 4 + 4  # the slot written and its index; the cell state stays on chip
    assert read.bytes == 256 * 1024 * 2 + 4 * 1024 * 2 + 4  # the weights, one slot of the gates, its index


# Three in-place scatters of 64 rows into a table: fused, one sets the rows and one adds to
# them; one adds, unfused.
SCATTERS = """
%set (old: f32[], new: f32[]) -> f32[] {
  %old = f32[] parameter(0)
  ROOT %new = f32[] parameter(1)
}

%add (a: f32[], b: f32[]) -> f32[] {
  %a = f32[] parameter(0)
  %b = f32[] parameter(1)
  ROOT %sum = f32[] add(%a, %b)
}

%set_rows (table: f32[4096,512], ids: s32[64,1], rows: f32[64,512]) -> f32[4096,512] {
  %table = f32[4096,512]{1,0} parameter(0)
  %ids = s32[64,1]{1,0} parameter(1)
  %rows = f32[64,512]{1,0} parameter(2)
  ROOT %put = f32[4096,512]{1,0} scatter(%table, %ids, %rows), to_apply=%set
}

%add_rows (table: f32[4096,512], ids: s32[64,1], rows: f32[64,512]) -> f32[4096,512] {
  %table = f32[4096,512]{1,0} parameter(0)
  %ids = s32[64,1]{1,0} parameter(1)
  %rows = f32[64,512]{1,0} parameter(2)
  ROOT %added = f32[4096,512]{1,0} scatter(%table, %ids, %rows), to_apply=%add
}

ENTRY %e (t: f32[4096,512], i: s32[64,1], r: f32[64,512]) -> f32[4096,512] {
  %t = f32[4096,512]{1,0} parameter(0)
  %i = s32[64,1]{1,0} parameter(1)
  %r = f32[64,512]{1,0} parameter(2)
  %s = f32[4096,512]{1,0} fusion(%t, %i, %r), kind=kInput, calls=%set_rows
  %a = f32[4096,512]{1,0} fusion(%s, %i, %r), kind=kInput, calls=%add_rows
  ROOT %u = f32[4096,512]{1,0} scatter(%a, %i, %r), to_apply=%add
}
"""


def test_a_scatter_that_adds_reads_the_rows_it_updates():
    """Both read their 64 rows and ids and write 64 rows of the table; the add reads those rows
    of the table too (Adagrad's sparse update of the softmax table, and its gradient)."""
    put, added, unfused = Program(SCATTERS, "cuda").kernels()
    rows, ids = 64 * 512 * 4, 64 * 4
    assert (put.bytes, added.bytes, unfused.bytes) == (2 * rows + ids, 3 * rows + ids, 3 * rows + ids)


# A fusion gathers 64 rows of a table (zero where the id is out of range), gathers 64 rows of
# those again and keeps 16 of them: the table's rows it reads are the 16 kept.
GATHERED_TWICE = """
%rows (table: f32[4096,512], ids: s32[64,1], valid: pred[64,1,512], again: s32[64,1]) -> bf16[16,1,512] {
  %table = f32[4096,512]{1,0} parameter(0)
  %ids = s32[64,1]{1,0} parameter(1)
  %valid = pred[64,1,512]{2,1,0} parameter(2)
  %again = s32[64,1]{1,0} parameter(3)
  %first = f32[64,1,512]{2,1,0} gather(%table, %ids), offset_dims={1,2}, slice_sizes={1,512}
  %zero = f32[] constant(0)
  %zeros = f32[64,1,512]{2,1,0} broadcast(%zero), dimensions={}
  %filled = f32[64,1,512]{2,1,0} select(%valid, %first, %zeros)
  %flat = f32[64,512]{1,0} bitcast(%filled)
  %second = f32[64,1,512]{2,1,0} gather(%flat, %again), offset_dims={1,2}, slice_sizes={1,512}
  %narrow = bf16[64,1,512]{2,1,0} convert(%second)
  ROOT %kept = bf16[16,1,512]{2,1,0} slice(%narrow), slice={[0:16], [0:1], [0:512]}
}

ENTRY %e (t: f32[4096,512], i: s32[64,1], v: pred[64,1,512], a: s32[64,1]) -> bf16[16,1,512] {
  %t = f32[4096,512]{1,0} parameter(0)
  %i = s32[64,1]{1,0} parameter(1)
  %v = pred[64,1,512]{2,1,0} parameter(2)
  %a = s32[64,1]{1,0} parameter(3)
  ROOT %f = bf16[16,1,512]{2,1,0} fusion(%t, %i, %v, %a), kind=kLoop, calls=%rows
}
"""


def test_rows_gathered_twice_and_sliced_read_the_rows_kept():
    """The softmax's candidates' rows, gathered from the step's rows of the table and narrowed:
    16 of the table's rows read (not the 64 of the first gather), with their ids, mask rows and
    second ids (the result's share of the others, a slice of what it computes), 16 rows written."""
    (fusion,) = Program(GATHERED_TWICE, "cuda").kernels()
    assert fusion.bytes == 16 * 512 * 4 + 2 * 16 * 4 + 16 * 512 + 16 * 512 * 2


DMA = (
    "ENTRY %e (w: f32[2048,2048]) -> f32[512,2048] {\n"
    "  %state_params__token_encoder__w = f32[2048,2048]{1,0:T(8,128)} parameter(0)\n"
    "  %dma = ((f32[2048,2048]{1,0:T(8,128)}), f32[512,2048]{1,0:T(8,128)S(1)}, s32[]{:S(2)}) "
    "slice-start(%state_params__token_encoder__w), slice={[0:512], [0:2048]}\n"
    "  ROOT %slice-done.1 = f32[512,2048]{1,0:T(8,128)S(1)} slice-done(%dma)\n"
    "}\n"
)


def test_a_dma_of_a_slice_reads_the_slice_for_the_part_whose_array_it_moves():
    """libtpu moves a quarter of a highway weight into on-chip memory: 4 MB read from HBM (not
    the 16 MB array twice), counted with the token encoder, whose parameter it is."""
    (dma,) = Program(DMA, "tpu").kernels()
    assert (dma.opcode, dma.bytes, dma.part) == ("slice-start", 512 * 2048 * 4, "token_encoder")


GATHER_OFFLOAD = (
    "ENTRY %e (table: f32[793471,512], ids: s32[2048]) -> f32[2048,512] {\n"
    "  %table = f32[793471,512]{1,0:T(8,128)} parameter(0)\n"
    "  %ids = s32[2048]{0:T(1024)} parameter(1)\n"
    '  %start = ((), (), (s32[8192]{0:T(1024)})) custom-call-start(), async_execution_thread="sparsecore", '
    'metadata={op_name="jit(train_step)/softmax/gather"}, backend_config={"sparse_core_config":{"offload":'
    '"OFFLOAD_GATHER"}}\n'
    "  %start.update = ((f32[793471,512]{1,0:T(8,128)}, s32[2048]{0:T(1024)}), f32[2048,512]{1,0:T(8,128)}, "
    "(s32[8192]{0:T(1024)})) custom-call-update(%start, %table, %ids)\n"
    "  ROOT %rows = f32[2048,512]{1,0:T(8,128)} custom-call-done(%start.update)\n"
    "}\n"
)


def test_a_gather_offloaded_to_a_sparsecore_reads_the_rows_it_gathers():
    """v5p and v6e gather the sampled softmax rows on their SparseCores (start, update, done):
    one kernel that reads and writes the 2,048 rows and reads their ids, not the 1.6 GB table
    twice (3.3 GB a gather, 7 GB of the v5p step before)."""
    (gather,) = Program(GATHER_OFFLOAD, "tpu").kernels()
    assert (gather.opcode, gather.part) == ("custom-call-update", "softmax")
    assert gather.bytes == 2 * 2048 * 512 * 4 + 2048 * 4


GPUS = [name for name in sorted(TARGETS) if TARGETS[name].platform == "cuda"]


# The fused cell's fixed blocks on the GPU with the least shared memory (an A100's) in both
# dtypes, and on the measured H200 in bfloat16: an H100's shared memory is an H200's.
FUSED_CASES = [("a100", "float32"), ("a100", "bfloat16"), ("h200", "bfloat16")]


@pytest.mark.slow
@pytest.mark.launches
@pytest.mark.targets
@pytest.mark.parametrize(
    "name, dtype, lstm_cell",
    [(name, dtype, "auto") for name in GPUS for dtype in ("float32", "bfloat16")]
    + [(name, dtype, "fused") for name, dtype in FUSED_CASES],
)
def test_the_published_models_default_train_step_compiles_for_every_gpu(tmp_path, name, dtype, lstm_cell):
    """elmo_original's step with every default (lstm_cell and char_conv auto: our kernels on
    GPUs), as `plan` compiles it: at 32 rows per device and a small vocabulary (neither changes
    our kernels' blocks) to keep it quick. Until the char CNN's kernels chose their blocks, float32
    failed on every GPU here and bfloat16 on an A100 (a kernel over the shared memory). The same
    with lstm_cell=fused at 128 rows, its largest blocks (whose operands Triton stages in shared
    memory), where shared memory is least (FUSED_CASES; every GPU and dtype compiled with `plan`
    on 2026-12-06, docs/PERFORMANCE.md)."""
    _need_plugin()
    args = ["plan", "--config=elmo_original", f"--target={name}", "--vocab_size=10000", "--nofit"]
    args += [f"--config.train.compute_dtype={dtype}"]
    if lstm_cell == "fused":
        args += ["--config.train.lstm_schedule=wavefront", "--config.train.lstm_cell=fused"]
    args += [f"--config.train.per_device_batch_size={32 if lstm_cell == 'auto' else 128}"]
    result = run_cli(args, {"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    assert (plan["lstm_cell"], plan["char_conv"]) == ("pallas" if lstm_cell == "auto" else "fused", "pallas")
    assert sorted(plan["char_blocks"]) == sorted(
        ("char_cnn_max", "char_cnn_character_gradients", "char_cnn_filter_gradients")
    )
    assert plan["memory"]["needs"] < plan["memory"]["capacity"]


TPUS = [name for name in sorted(TARGETS) if TARGETS[name].platform == "tpu"]


@pytest.mark.slow
@pytest.mark.launches
@pytest.mark.targets
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", TPUS)
def test_the_published_models_default_train_step_compiles_for_every_tpu(tmp_path, name, dtype):
    """elmo_original's step with every default for a TPU (char_conv and softmax_kernel auto: our
    char CNN's and sampled softmax's kernels' TPU variants, which Mosaic compiles; XLA's LSTM
    cell), at 32 rows per device and a small vocabulary: the char CNN's three kernels and the
    softmax's two a direction are in the program, each counted as the bytes and FLOPs it declares."""
    _need_plugin(tpu=True)
    program = tmp_path / "step.hlo"
    args = ["plan", "--config=elmo_original", f"--target={name}", "--vocab_size=10000", "--nofit"]
    args += ["--config.train.per_device_batch_size=32", f"--config.train.compute_dtype={dtype}", f"--hlo={program}"]
    result = run_cli(args, {"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout.strip().splitlines()[-1])
    assert (plan["lstm_cell"], plan["char_conv"], plan["softmax_kernel"]) == ("xla", "pallas", "pallas")
    assert set(plan["never_run"]) == {*plan["char_blocks"], softmax_kernels.LSE, softmax_kernels.GRADIENT}
    kernels = [k for k in Program(program.read_text(), "tpu").kernels() if k.kind == "pallas"]
    by_part = {
        part: sorted(k.source.split("/")[-2] for k in kernels if k.part == part) for part in {k.part for k in kernels}
    }
    assert by_part == {
        "token_encoder": sorted(plan["char_blocks"]),
        "softmax": sorted([softmax_kernels.LSE, softmax_kernels.GRADIENT] * 2),
    }
    assert all(k.bytes > 0 and k.flops > 0 for k in kernels)


# The published char CNN (experiments/elmo_original.py): 7 filters up to width 7 over 16-wide
# character embeddings (112-wide windows), 2,048 filters, 50 characters.
PUBLISHED_CHAR_CNN = (50, 16, 128, 2048)  # W, D, K, F as the kernels see them


def test_the_softmax_kernels_on_a_gpu_need_rows_a_power_of_two_wide(caplog):
    """Triton's blocks span powers of two: rows (projection_dim) 96 wide get XLA's sampled
    softmax under auto, said once, and a refusal naming the width where the kernels are named."""
    _need_plugin()
    import logging
    from types import SimpleNamespace

    from elmo_jax.errors import UserError
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.softmax import kernel
    from elmo_jax.plan.program import abstract_devices

    def config(P):
        return SimpleNamespace(softmax_kernel="auto", compute_dtype="bfloat16", lstm=SimpleNamespace(projection_dim=P))

    with tracing_for("gpu", abstract_devices(TARGETS["h200"], 1)[0]), caplog.at_level(logging.WARNING):
        assert kernel(config(64)) == "pallas"
        assert kernel(config(96)) == "xla"
        with pytest.raises(UserError, match="softmax_kernel='pallas': .*rows are 96 wide"):
            softmax_kernels.chosen_block(96, "bfloat16")
    assert "rows are 96 wide" in caplog.text


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("name", GPUS)
def test_the_char_cnn_kernels_choose_blocks_that_fit_each_gpu(name, dtype):
    """Triton stages a block's operands in the GPU's shared memory: the published sizes' largest
    block of the filter gradients asks an A100 for 229,376 bytes in float32 (166,912 there).
    Each kernel takes the largest block whose kernel compiles for the target; on an H200 in
    bfloat16 (the measured program) that is the largest of all."""
    _need_plugin()
    import jax

    from elmo_jax.model import char_kernels
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.plan.program import abstract_devices

    # The precision of a run (float32 products as TF32), not the tests' "highest" (conftest.py).
    with tracing_for("gpu", abstract_devices(TARGETS[name], 1)[0]), jax.default_matmul_precision("default"):
        assert char_kernels.unfit(*PUBLISHED_CHAR_CNN, dtype) is None
        chosen = {
            kernel: char_kernels.chosen_block(kernel, *PUBLISHED_CHAR_CNN, dtype) for kernel in char_kernels.KERNELS
        }
        for kernel, block in chosen.items():  # the largest that fits
            larger = char_kernels.BLOCKS[: char_kernels.BLOCKS.index(block)]
            assert all(char_kernels._refusal(kernel, b, *PUBLISHED_CHAR_CNN, dtype) for b in larger), (kernel, block)
    if (name, dtype) == ("h200", "bfloat16"):
        assert set(chosen.values()) == {char_kernels.BLOCKS[0]}
    if (name, dtype) == ("a100", "float32"):  # the filter gradients' float32 windows do not fit the largest block
        assert chosen[char_kernels.FILTERS] != char_kernels.BLOCKS[0]


def test_a_gpu_too_small_for_the_char_cnn_kernels_gets_xlas_with_one_warning_or_a_one_line_refusal(caplog):
    """Where no block fits (here a GPU of 16 KiB of shared memory a block), char_conv=auto falls
    back to XLA's path, saying why once; char_conv=pallas is refused naming the kernel."""
    _need_plugin()
    import dataclasses
    import logging

    from elmo_jax.experiments import elmo_original

    from elmo_jax.errors import UserError
    from elmo_jax.experiment import model_config
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.token_encoder import conv, kernel_blocks
    from elmo_jax.plan.program import abstract_devices

    a100 = TARGETS["a100"]
    small = {"shared_memory_per_block_optin": 16 * 1024, "shared_memory_per_core": 16 * 1024}
    kind = "NVIDIA A100 of 16 KiB of shared memory a block"  # a GPU Pallas knows, as no cached probe names it
    tiny = dataclasses.replace(a100, name="tiny", description=kind, gpu={**a100.gpu, **small})
    model = model_config(elmo_original.get_config())
    with tracing_for("gpu", abstract_devices(tiny, 1)[0]), caplog.at_level(logging.WARNING):
        assert conv(model) == "xla" and conv(model) == "xla"
        with pytest.raises(UserError, match=r"char_conv='pallas': the char CNN kernel char_cnn_\w+ does not fit"):
            kernel_blocks(dataclasses.replace(model, char_conv="pallas"))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("char_conv='auto': XLA's char CNN, as ours cannot run here: the char CNN kernel")
    assert kind in warning and "Shared memory" in warning


def _demo_model(char_conv: str = "auto"):
    import dataclasses

    from elmo_jax.experiments import demo

    from elmo_jax.experiment import model_config

    return dataclasses.replace(model_config(demo.get_config()), compute_dtype="bfloat16", char_conv=char_conv)


def test_the_char_cnn_blocks_are_chosen_before_the_step_is_traced_once_for_every_width(monkeypatch):
    """The train step's char CNN blocks were chosen inside its trace, compiling Triton kernels
    there once per width of words a batch brought, in a cache without a lock. Now
    make_train_step chooses them (at the widest width) before anything is traced; every width
    after, and threads asking at once, compile nothing more."""
    _need_plugin()
    import threading

    import jax
    from elmo_jax.experiments import demo

    from elmo_jax.experiment import train_settings
    from elmo_jax.model import char_kernels, kernel_calls
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.model.token_encoder import _kernel_sizes
    from elmo_jax.plan.program import abstract_devices
    from elmo_jax.train.step import make_train_step

    compiled, real = [], kernel_calls._compile_alone

    def counted(build, *rest):  # the char CNN's kernels compiled alone (the softmax's are probed too)
        def recorded(operand):
            probes = build(operand)
            compiled.extend(name for name in probes if name in char_kernels.KERNELS)
            return probes

        return real(recorded, *rest)

    monkeypatch.setattr(kernel_calls, "_compile_alone", counted)
    monkeypatch.setattr(kernel_calls, "_REFUSALS", {})
    model = _demo_model()
    W, D, K, F = _kernel_sizes(model)
    with tracing_for("gpu", abstract_devices(TARGETS["h200"], 1)[0]), jax.default_matmul_precision("default"):
        make_train_step(model, train_settings(demo.get_config(), 2000))  # jit only: nothing traced yet
        assert sorted(compiled) == sorted(char_kernels.KERNELS)  # the largest blocks fit
        chosen = {k: char_kernels.chosen_block(k, W, D, K, F, "bfloat16") for k in char_kernels.KERNELS}
        for width in (3, 11, W):  # the widths batches bring
            assert {k: char_kernels.chosen_block(k, width, D, K, F, "bfloat16") for k in chosen} == chosen
        assert len(compiled) == len(char_kernels.KERNELS)
        monkeypatch.setattr(kernel_calls, "_REFUSALS", {})  # compiled afresh at the narrowest: the same blocks
        assert {k: char_kernels.chosen_block(k, 3, D, K, F, "bfloat16") for k in chosen} == chosen
        compiled.clear()

        monkeypatch.setattr(kernel_calls, "_REFUSALS", {})
        on = char_kernels.device()

        def ask() -> None:
            with tracing_for("gpu", on), jax.default_matmul_precision("default"):
                char_kernels.chosen_block(char_kernels.MAX, W, D, K, F, "bfloat16")

        threads = [threading.Thread(target=ask) for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
    assert len(compiled) == 1  # four threads, one compile


def test_a_char_cnn_kernel_that_fails_to_compile_gets_xlas_under_auto_with_one_warning(monkeypatch, caplog):
    """Only a kernel over the shared memory fell back to XLA's path; any other compile error
    failed `auto`. It stays an error where the user asked for our kernels."""
    _need_plugin()
    import logging

    import jax

    from elmo_jax.model import kernel_calls, token_encoder
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.plan.program import abstract_devices

    def broken(*args):
        raise jax.errors.JaxRuntimeError("INTERNAL: Triton lowering failed")

    monkeypatch.setattr(kernel_calls, "_compile_alone", broken)
    monkeypatch.setattr(kernel_calls, "_REFUSALS", {})
    kernel_calls.say_once.cache_clear()
    with tracing_for("gpu", abstract_devices(TARGETS["h100"], 1)[0]), caplog.at_level(logging.WARNING):
        assert token_encoder.resolved(_demo_model()).char_conv == "xla"
        assert token_encoder.conv(_demo_model()) == "xla"
        with pytest.raises(jax.errors.JaxRuntimeError, match="Triton lowering failed"):
            token_encoder.resolved(_demo_model("pallas"))
    (warning,) = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert "XLA's char CNN" in warning and "compiling them failed (JaxRuntimeError: INTERNAL: Triton" in warning


def test_a_kernel_over_the_shared_memory_is_not_blamed_on_the_batch():
    """A program whose kernel asks for more shared memory than the GPU has does not compile at
    any batch: plan says so (a UserError), not that the rows do not fit (DoesNotFit, which
    --fit would take as a reason to search for fewer)."""
    _need_plugin()
    import dataclasses

    import jax
    import jax.numpy as jnp

    from elmo_jax.errors import UserError
    from elmo_jax.model import char_kernels
    from elmo_jax.model.backend import tracing_for
    from elmo_jax.plan.program import DoesNotFit, abstract_devices, compile_within_memory

    a100 = TARGETS["a100"]
    small = {"shared_memory_per_block_optin": 16 * 1024, "shared_memory_per_core": 16 * 1024}
    tiny = dataclasses.replace(a100, name="tiny", description="NVIDIA A100 (tiny)", gpu={**a100.gpu, **small})
    on = abstract_devices(tiny, 1)[0]
    mesh = jax.sharding.Mesh([on], ("x",))
    sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    W, D, K, F = PUBLISHED_CHAR_CNN
    shapes = [((64, (W - 1) * D + K), jnp.float32), ((K, F), jnp.float32), ((F,), jnp.int32)]
    operands = [jax.ShapeDtypeStruct(shape, dtype, sharding=sharding) for shape, dtype in shapes]
    with tracing_for("gpu", on), jax.sharding.use_abstract_mesh(mesh.abstract_mesh):
        lowered = jax.jit(lambda *a: char_kernels.max_and_ties(*a, W, D, "float32", (64, 128))).lower(*operands)
    with pytest.raises(
        UserError, match=r"does not compile for tiny at any batch: .* bytes of shared memory"
    ) as refused:
        compile_within_memory(lowered, tiny, 128)
    assert not isinstance(refused.value, DoesNotFit)
