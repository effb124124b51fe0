"""Pod attribution: kubelet pod-resources (device plugins and DRA claims), ResourceSlices, per-process figures on shared GPUs."""
