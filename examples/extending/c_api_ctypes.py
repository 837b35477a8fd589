"""strata's offloaded AdamW from Python through the C interface (strata_c.h) and ctypes alone:
no compiler, no binding code. Usage: c_api_ctypes.py LIBSTRATA_C. Exits 1 when a check fails."""
import ctypes as C
import sys

# doc-snippet: declare
lib = C.CDLL(sys.argv[1])


class Config(C.Structure):  # strata_adamw_config, field for field
    _fields_ = [("preset", C.c_char_p), ("paths", C.POINTER(C.c_char_p)), ("path_count", C.c_size_t),
                ("lr", C.c_double), ("beta1", C.c_double), ("beta2", C.c_double), ("eps", C.c_double),
                ("weight_decay", C.c_double), ("subgroup_elems", C.c_size_t), ("cache_subgroups", C.c_size_t),
                ("threads", C.c_size_t)]


floats = C.POINTER(C.c_float)
lib.strata_last_error.restype = C.c_char_p
lib.strata_adamw_config_init.argtypes = [C.POINTER(Config)]
lib.strata_adamw_create.argtypes = [C.POINTER(Config), floats, C.c_size_t, C.POINTER(C.c_void_p)]
lib.strata_adamw_step.argtypes = [C.c_void_p, floats, C.c_double, floats, C.c_void_p]
lib.strata_adamw_read_master.argtypes = [C.c_void_p, floats]
lib.strata_adamw_step_count.argtypes = [C.c_void_p]
lib.strata_adamw_step_count.restype = C.c_uint64
lib.strata_adamw_destroy.argtypes = [C.c_void_p]


def check(status):  # a failed call raises with strata's message
    if status != 0:
        raise RuntimeError(f"strata status {status}: {lib.strata_last_error().decode()}")
# doc-snippet-end


# doc-snippet: use
n = 4096
config = Config()
lib.strata_adamw_config_init(C.byref(config))
paths = (C.c_char_p * 1)(b"")  # one path, in host memory
config.paths, config.path_count = paths, 1
config.lr, config.subgroup_elems, config.threads = 1e-2, 1024, 2

w = (C.c_float * n)(*([0.5] * n))
opt = C.c_void_p()
check(lib.strata_adamw_create(C.byref(config), w, n, C.byref(opt)))
try:
    for _ in range(3):
        g = (C.c_float * n)(*[x - 0.25 for x in w])  # the gradient of sum((w - 0.25)^2) / 2
        check(lib.strata_adamw_step(opt, g, config.lr, w, None))  # updates w in place
    master = (C.c_float * n)()
    check(lib.strata_adamw_read_master(opt, master))
    ok = lib.strata_adamw_step_count(opt) == 3 and list(master) == list(w) and w[0] < 0.5
    print(f"3 steps from Python: w[0] 0.5 -> {w[0]:.4f}; model equals the master weights: {ok}")
finally:
    lib.strata_adamw_destroy(opt)

config.preset = b"adam"
status = lib.strata_adamw_create(C.byref(config), w, n, C.byref(opt))
print(f"a bad preset: status {status}, {lib.strata_last_error().decode()!r}")
sys.exit(0 if ok and status == 1 else 1)
# doc-snippet-end
