"""The host: systemd units (services), GPUs through NVML (gpus), processes (processes), ports,
disk and Python packages (checks, packages). Kinds and checks that know nothing of serving."""
