"""How throughput scales with devices: scaling, DDP sync, contention, the scaling model's check."""
