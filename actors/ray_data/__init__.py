"""The Ray Data door: :class:`BlockServeActor` for ``map_batches``, its ``build_processor`` stage
(``processor``), the batch formats in and out (``batch_rows``, ``row_params``, ``row_outputs``), and
what the driver learns of each actor (``actor_stats``, ``device_stats``, ``placement``, the job's
``stats_registry``, its ``batch_deaths`` ledger and the ``batch_admission`` of each batch to it). Imports
nothing, so ``import actors`` stays light."""
