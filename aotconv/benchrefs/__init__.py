"""The reference implementations `aotconv bench` times beside ours, in the same process:
torch_ref (PyTorch: cuDNN on an NVIDIA GPU, its own convolution on a CPU) and clblast
(CLBlast's convgemm through ctypes). Each is optional; each module's `available()` says
whether it is present here and, if not, why."""
