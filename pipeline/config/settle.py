"""When DDP's step settles: the first step whose reducer no longer synchronises the host.

DDP's reducer collects runtime stats on iterations 1-10 (torch/csrc/distributed/c10d/reducer.cpp,
Reducer::should_collect_runtime_stats: num_iterations_ <= 10, then every 100th, kDDPRuntimeLoggingSampleRate), and
DDP's forward logs them before prepare_for_forward counts the new iteration, so 0-based steps 1-10 wait on the last
step's timer events (reducer_cuda.cpp CudaTimer::measureDifference synchronizes them: a host sync on GPUs).

A module of its own, with no imports, in the trial's code digest (sweep/provenance.py TRIAL_CODE): a CUDA graph's
capture step comes from here (trial/graphs.py), so changing it changes the figures a graph trial measures and names a
new study; the configuration (warm-up defaults of doctor, the ladder, the gpu and slurm profiles) reads it too.
"""

DDP_RUNTIME_STATS_ITERATIONS = 10
# the first step none of those synchronises: a timed window (train.warmup_steps) or a CUDA graph capture that opens
# here holds none of them until the 100th step (doctor, gpu_epoch, the gpu and slurm profiles, trial/graphs.py)
DDP_SETTLE_STEPS = DDP_RUNTIME_STATS_ITERATIONS + 1
