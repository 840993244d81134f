# Sourced by the GPU-machine scripts: NVLink multicast off, and the NCCL asynctp was built against
# (PyTorch's 2.28.9 in site-packages, not the system's 2.28.3) first on the library path.
# Needs $build (the build folder) set before it is sourced.
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
nccl_lib=$(python3 -c 'import nvidia.nccl, os; print(os.path.join(list(nvidia.nccl.__path__)[0], "lib"))' 2>/dev/null)
export LD_LIBRARY_PATH=${nccl_lib:+$nccl_lib:}/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
if ldd "$build/tests/asynctp_gpu_tests" | grep -q "libcublasLt.so.13 => not found"; then
  cublas=$(dirname "$(find / -name 'libcublasLt.so.13' -not -path '/proc/*' 2>/dev/null | head -1)")
  export LD_LIBRARY_PATH=$cublas:$LD_LIBRARY_PATH
fi
