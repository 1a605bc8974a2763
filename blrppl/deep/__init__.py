"""The BLR with a diagonal Gaussian over all latents: Table 1's deep-learning rows (Sec. 4)."""
