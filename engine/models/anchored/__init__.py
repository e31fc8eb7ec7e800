"""Models whose answer blocks are anchored after a causal context (Nemotron-Labs-Diffusion): a prompt and each
finished block are stored causally, and the active block is denoised bidirectionally over them."""
