"""The API process's request side, behind the HTTP routes: the `TokenizerManager` (tokenizing,
checks and limits, request state by rid, outputs routed back), its client of the scheduler
(`SchedulerLink`) and the data-parallel router over `--dp-size` replicas (`DataParallelController`,
its load-balancing policies), and the metrics and request log it keeps."""
