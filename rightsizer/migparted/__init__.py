"""NVIDIA's config formats: mig-parted configs and device-plugin time-slicing."""
