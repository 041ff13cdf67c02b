"""torch's backend autoload hook for qcomm (the "torch.backends" entry point of an installed
qcomm): `import torch` calls register(), so that init_process_group("qnccl") works in a program
that never imports qcomm. It registers the backend lazily: qcomm and its extension load when the
first qnccl group is created, not at every `import torch`. TORCH_DEVICE_BACKEND_AUTOLOAD=0
turns torch's autoload off; `import qcomm` keeps working either way."""


def _create(opts, pg_options):
    import qcomm

    return qcomm._create(opts, pg_options)


def register() -> None:
    """Registers the qnccl backend with torch.distributed unless it is registered already."""
    import torch.distributed as dist

    if not dist.is_available() or hasattr(dist.Backend, "QNCCL"):
        return
    dist.Backend.register_backend("qnccl", _create, extended_api=True, devices=["cpu", "cuda"])
