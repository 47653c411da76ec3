"""A first look at the GPU machine: the install, a build for the device, one launch through CuPy, the driver's
parameter census. Run on the device; prints facts only."""
import subprocess, sys, time
import numpy as np

t0 = time.time()
from cuda.bindings import driver as drv
print("cuInit", drv.cuInit(0))
print("driver", drv.cuDriverGetVersion())
print("has cuFuncGetParamInfo", hasattr(drv, "cuFuncGetParamInfo"))
sys.path.insert(0, "tests")
from gpu_support import kernels, to_device, empty_device, from_device
k = kernels("sm_90a")
print("built in", round(time.time() - t0, 2), "s")
n = 1 << 20
x = np.random.default_rng().uniform(-30, 30, n)
for dt in ("f32", "bf16", "f16"):
    xd = to_device(x, dt); yd = empty_device(n, dt)
    k.launch(f"softplus_forward_{dt}", (min(-(-n // 256), 4096),), (256,), (yd, xd, np.int64(n)))
    xr = from_device(xd, dt); ref = np.where(xr > 20, xr, np.log1p(np.exp(np.minimum(xr, 20))))
    y = from_device(yd, dt)
    print(dt, "max rel err", float(np.max(np.abs(y - ref) / np.maximum(np.abs(ref), 1e-30))), "nan", int(np.isnan(y).sum()))
f = k.fn("softplus_forward_bf16")
print("cupy attrs", f.attributes)
for tool in ("compute-sanitizer --version", "ncu --version", "cuobjdump --version", "nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv"):
    r = subprocess.run(tool, shell=True, capture_output=True, text=True)
    print(tool.split()[0], "->", (r.stdout or r.stderr).strip().splitlines()[-1:] )
