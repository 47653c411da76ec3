"""Stage 2, build and admit: NVRTC, the private cache, compile workers, cubin resources, static admission."""
