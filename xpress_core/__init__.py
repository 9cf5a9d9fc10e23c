"""xPress: speculative decoding with a parallel-refinement diffusion drafter, and the tools to see and measure it."""
