"""The NVML backend: ``backend.NvmlBackend`` is the only module that imports ``pynvml``; ``fields``, ``gpm``, ``mig`` and ``xid`` get the library as an object."""
