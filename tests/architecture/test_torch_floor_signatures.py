"""Every torch attribute a GPU-only branch touches exists in the installed PyTorch, and takes the arguments the code
passes (inspect.signature): run here on the tested PyTorch, and by `make check-floor` on the 2.11 floor, so an API
newer than the floor on a path no CPU test runs fails on a CPU host instead of on the first GPU node.

What it proves: names and call shapes (argument counts, keyword names). What only a GPU shows: that the calls
behave as the code expects (devices, streams, NCCL, CUPTI). Builtins without a signature are checked for existence
only; the device-property fields exist only in CUDA builds of torch (the floor's PyPI wheel is one).

To extend: add one row to CALLS (a callable: dotted path, positional arguments passed, keyword names passed, where)
or to READS (an attribute read or set, not called). A row whose name no longer appears in pipeline/ or benchmarks/ fails
(test_every_row_is_still_called), so the table follows the code.
"""

from __future__ import annotations

import importlib
import inspect

import pytest
import torch

SELF = object()  # a method's receiver, for binding
EXISTS = None  # positional count meaning "a builtin without a signature: check that it exists"

# (dotted path, positional args passed, keyword args passed, where the code calls it)
CALLS = (
    # devices and host facts
    ("torch.cuda.is_available", 0, (), "devices.py, capabilities.py"),
    ("torch.cuda.device_count", 0, (), "devices.py, overlap.py"),
    ("torch.cuda.get_device_name", 1, (), "devices.py, capabilities.py"),
    ("torch.cuda.get_device_capability", 1, (), "capabilities.py"),
    ("torch.cuda.get_device_properties", 1, (), "capabilities.py; NVML mapping by uuid / PCI id"),
    ("torch.cuda.set_device", 1, (), "strategies/base.py, strategies/distributed.py, collectives.py"),
    ("torch.cuda.synchronize", 1, (), "strategies/base.py, collectives.py, overlap.py, benchmarks/speed/mfu.py"),
    ("torch.cuda.empty_cache", 0, (), "benchmarks/gpu/gpu_epoch.py"),
    ("torch.cuda.is_bf16_supported", 0, ("including_emulation",), "strategies/ddp_amp.py"),
    ("torch.cuda.nccl.version", 0, (), "capabilities.py"),
    ("torch.backends.cudnn.version", 0, (), "capabilities.py"),
    ("torch.cuda._get_nvml_device_index", 1, (), "benchmarks/gpu/gpu_first_run.py: host facts"),
    # allocator statistics
    ("torch.cuda.reset_peak_memory_stats", 1, (), "measure/memory.py"),
    ("torch.cuda.max_memory_allocated", 1, (), "measure/memory.py"),
    ("torch.cuda.memory_allocated", 1, (), "measure/memory.py: resident at the window's first opening"),
    ("torch.cuda.max_memory_reserved", 1, (), "measure/memory.py: reserved peak"),
    # process groups and collectives
    (
        "torch.distributed.init_process_group",
        1,
        ("store", "rank", "world_size", "timeout", "device_id"),
        "strategies/distributed.py, collectives.py",
    ),
    ("torch.distributed.barrier", 0, (), "collectives.py, strategies/shm_allreduce.py"),
    ("torch.distributed.rendezvous", 3, ("timeout",), "collectives.py: the ranks' store (G9)"),
    ("torch.distributed.all_gather_into_tensor", 2, (), "collectives.py (older name of all_gather_single)"),
    ("torch.distributed.reduce_scatter_tensor", 2, (), "collectives.py (older name of reduce_scatter_single)"),
    ("torch.distributed.broadcast_object_list", 1, ("src",), "strategies/shm_allreduce.py"),
    (
        "torch.nn.parallel.DistributedDataParallel",
        1,
        ("device_ids", "bucket_cap_mb", "gradient_as_bucket_view", "static_graph", "broadcast_buffers"),
        "strategies/ddp.py (broadcast_buffers: where torch lacks its newer name, forward_sync_buffers)",
    ),
    ("torch.nn.parallel.DistributedDataParallel._set_ddp_runtime_logging_sample_rate", 1, (), "comm_probes.py"),
    ("torch.nn.parallel.DistributedDataParallel._get_ddp_logging_data", 0, (), "comm_probes.py"),
    ("torch.nn.parallel.DistributedDataParallel.register_comm_hook", 2, (), "strategies/ddp.py"),
    ("torch.nn.DataParallel", 1, ("device_ids", "output_device"), "strategies/dp.py"),
    ("torch.nn.DataParallel.replicate", 2, (), "strategies/dp.py: SameLayoutDataParallel overrides it"),
    ("torch.nn.parallel.scatter", 2, (), "strategies/dp_criterion.py"),
    ("torch.nn.parallel.replicate", 2, (), "strategies/dp_criterion.py"),
    ("torch.nn.parallel.parallel_apply", 2, ("devices",), "strategies/dp_criterion.py"),
    ("torch.nn.parallel.gather", 2, ("dim",), "strategies/dp_criterion.py"),
    ("torch.nn.parallel.comm.broadcast", 2, (), "collectives.py (dp_copy)"),
    ("torch.nn.parallel.comm.scatter", 2, (), "collectives.py (dp_scatter)"),
    ("torch.distributed.fsdp.fully_shard", 1, (), "strategies/fsdp.py"),
    ("torch.distributed.checkpoint.state_dict.get_model_state_dict", 1, ("options",), "strategies/fsdp.py"),
    (
        "torch.distributed.checkpoint.state_dict.StateDictOptions",
        0,
        ("full_state_dict", "cpu_offload"),
        "strategies/fsdp.py",
    ),
    # mixed precision
    ("torch.amp.GradScaler", 1, ("enabled", "init_scale"), "strategies/ddp_amp.py"),
    ("torch.amp.GradScaler.get_scale", 0, (), "strategies/ddp_amp.py: the final scale"),
    ("torch.amp.GradScaler._found_inf_per_device", 1, (), "strategies/ddp_amp.py: skipped steps"),
    ("torch.autocast", 1, ("dtype",), "strategies/ddp_amp.py"),
    # profiler
    ("torch.profiler.profile", 0, ("activities", "schedule", "on_trace_ready"), "comm_probes.py"),
    ("torch.profiler.profile.events", 0, (), "comm_probes.py"),
    (
        "torch.autograd.profiler_util.FunctionEvent",
        0,
        ("name", "device_type", "is_user_annotation"),
        "comm_probes.py: kernels vs gpu_user_annotation",
    ),
    # streams and events
    ("torch.cuda.Stream", 1, (), "overlap.py: the side stream"),
    ("torch.cuda.stream", 1, (), "overlap.py"),
    ("torch.cuda.current_stream", 1, (), "overlap.py"),
    ("torch.cuda.Stream.wait_stream", 1, (), "overlap.py"),
    ("torch.Tensor.record_stream", EXISTS, (), "overlap.py, trial/graphs.py"),
    # CUDA graphs and compile's modes (train.cuda_graphs, train.compile_mode)
    ("torch.cuda.CUDAGraph", 0, (), "trial/graphs.py"),
    ("torch.cuda.CUDAGraph.replay", 0, (), "trial/graphs.py"),
    ("torch.cuda.graph", 1, ("stream", "capture_error_mode"), "trial/graphs.py: the whole step's capture"),
    ("torch.compile", 1, ("mode",), "trial/loop.py: train.compile_mode"),
    ("torch.cuda.mem_get_info", 0, (), "scaling/device.py: the device's memory"),
)

# (dotted path, where): attributes the code reads or sets
READS = (
    ("torch.profiler.ProfilerActivity.CPU", "comm_probes.py"),
    ("torch.profiler.ProfilerActivity.CUDA", "comm_probes.py"),
    ("torch.autograd.DeviceType.CUDA", "comm_probes.py"),
    ("torch.backends.cudnn.allow_tf32", "TF32 recorded and pinned (equivalence, host facts)"),
    ("torch.backends.cuda.matmul.allow_tf32", "TF32 recorded and pinned (equivalence, host facts)"),
    ("torch.backends.cudnn.conv.fp32_precision", "TF32 recorded (the per-operation switch)"),
    ("torch.backends.cuda.matmul.fp32_precision", "TF32 recorded (the per-operation switch)"),
    ("torch.version.cuda", "capabilities.py"),
)

# fields of torch.cuda.get_device_properties(i) the code reads (pybind: present only in CUDA builds). The PCI ids
# (capabilities.py's NVML mapping) are read with getattr(..., None) and not required: 2.11's torch/_C/__init__.pyi
# lists uuid but none of pci_bus_id, pci_device_id, pci_domain_id.
DEVICE_PROPERTIES = ("name", "major", "minor", "total_memory", "multi_processor_count", "uuid")


def resolve(path: str):
    """(parent, the object) for a dotted path, as `from parent import name` finds it: an attribute first (the
    package's `parallel_apply` function, not its module of that name), else the submodule."""
    parts = path.split(".")
    parent, obj = None, importlib.import_module(parts[0])
    for i, name in enumerate(parts[1:], start=2):
        if not hasattr(obj, name) and inspect.ismodule(obj):
            try:
                importlib.import_module(".".join(parts[:i]))
            except ModuleNotFoundError:
                pass
        parent, obj = obj, getattr(obj, name)  # AttributeError names what the installed torch lacks
    return parent, obj


@pytest.mark.parametrize("path, positional, keywords, where", CALLS, ids=[c[0] for c in CALLS])
def test_each_call_a_gpu_branch_makes_fits_the_installed_torch(path, positional, keywords, where):
    parent, obj = resolve(path)
    if positional is EXISTS:
        assert callable(obj), f"{path} ({where}) is not callable in torch {torch.__version__}"
        return
    args = [SELF] * positional
    if inspect.isclass(parent) and inspect.isfunction(inspect.getattr_static(parent, path.rsplit(".", 1)[1])):
        args.insert(0, SELF)  # a method, bound by hand
    sig = inspect.signature(obj)
    try:
        sig.bind_partial(*args, **{k: SELF for k in keywords})
    except TypeError as e:
        pytest.fail(
            f"{path}{sig} in torch {torch.__version__} does not take {positional} positional argument(s) "
            f"and keywords {keywords} as {where} passes them: {e}"
        )


@pytest.mark.parametrize("path, where", READS, ids=[r[0] for r in READS])
def test_each_attribute_a_gpu_branch_reads_exists(path, where):
    resolve(path)


@pytest.mark.skipif(
    not hasattr(torch._C, "_CudaDeviceProperties"),
    reason="a CPU-only build of torch has no CUDA device properties class",
)
def test_the_device_property_fields_read_exist():
    missing = [f for f in DEVICE_PROPERTIES if not hasattr(torch._C._CudaDeviceProperties, f)]
    assert not missing, f"torch {torch.__version__}'s CUDA device properties lack {missing}"


def test_the_table_rejects_what_a_floor_would_lack():
    """The check itself can fail: a keyword a function does not take, and a name torch does not have."""
    with pytest.raises(TypeError):
        inspect.signature(torch.cuda.synchronize).bind_partial(SELF, stream=SELF)
    with pytest.raises(AttributeError):
        resolve("torch.cuda.no_such_function")


def test_every_row_is_still_called():
    """The table follows the code: each row's last name appears in pipeline/ or benchmarks/ (a row left behind by a
    removed call would check nothing)."""
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    text = "\n".join(p.read_text() for d in ("pipeline", "benchmarks") for p in (root / d).rglob("*.py"))
    names = [c[0] for c in CALLS] + [r[0] for r in READS]
    gone = [n for n in names if n.rsplit(".", 1)[1] not in text]
    assert not gone, f"rows whose call is no longer in the code: {gone}"
