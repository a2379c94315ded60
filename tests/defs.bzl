"""devio_test: one cmocka test binary from tests/<name>.c."""

def devio_test(name, deps = [], copts = [], linkopts = [], size = "small", **kwargs):
    native.cc_test(
        name = name,
        srcs = [name + ".c"],
        copts = copts,
        linkopts = linkopts,
        size = size,
        deps = deps + ["@system//:cmocka", "//device/core"],
        **kwargs
    )
