# CUDA backend (OPGYM_CUDA=auto|on|off). Filled in by the CUDA work; for now: off.
set(OPGYM_HAVE_CUDA OFF)
