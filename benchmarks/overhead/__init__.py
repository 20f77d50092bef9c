"""What the pipeline's own machinery costs: the breakdown sampler, the DVC pipeline."""
