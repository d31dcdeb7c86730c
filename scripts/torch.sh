# Sourced by scripts/setup.sh and scripts/lock.sh. has_nvidia_gpu: an NVIDIA driver answers. install_torch PYTHON
# installs the torch build for this machine into the virtual environment of PYTHON, because anything that asks for
# torch without saying which build gets the
# multi-GB CUDA build from PyPI:
#   - on a machine with an NVIDIA driver (nvidia-smi), PyPI's torch, which is the CUDA build;
#   - elsewhere the CPU build ${RLFORGE_CPU_TORCH:-torch==2.13.0} with the local label +cpu: from a wheel folder pip
#     is given (PIP_FIND_LINKS or pip.conf's find-links) or an index that has it, its dependencies from PyPI; else
#     from PyTorch's CPU index (https://download.pytorch.org/whl/cpu).
has_nvidia_gpu() { command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; }

install_torch() {
  local py=$1 cpu_torch=${RLFORGE_CPU_TORCH:-torch==2.13.0}
  local pip=("$py" -m pip install -q --disable-pip-version-check)
  if has_nvidia_gpu; then
    "${pip[@]}" torch
  else
    "${pip[@]}" "${cpu_torch}+cpu" 2>/dev/null \
      || "${pip[@]}" --index-url https://download.pytorch.org/whl/cpu "$cpu_torch"
  fi
}
