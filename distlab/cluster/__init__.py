"""distlab.cluster: the Dask cluster a Lab runs on, and ranks on it.

``local`` starts the embedded cluster (a ``LocalCluster`` of non-daemonic workers, or dask-cuda's
on GPUs), describes any cluster as a ``ResourceSpec`` and heals lost workers; ``spmd`` runs one
pinned task per worker as one rank each, with a rendezvous, a timeout and cancellation;
``load`` watches the host's CPU while something is measured; ``interrupts`` holds the kernel's
interrupt while a cluster starts or stops. Nothing here knows a Lab or a Run.
"""
