"""devio_plugin: a backend plugin, a shared object that exports devio_backend_plugin and nothing else."""

def devio_plugin(name, linkopts = [], **kwargs):
    native.cc_binary(
        name = name,
        linkshared = True,
        additional_linker_inputs = ["//device:plugin.lds"],
        linkopts = linkopts + ["-Wl,--version-script=$(location //device:plugin.lds)"],
        **kwargs
    )
