"""RDMA through pyverbs: loading it where the machine has it (`verbs`), and the RC probe that
measures what a path failure costs a reliable-connected queue pair (`probe`, pure; `rc`, the
verbs ends). Used by `thornctl rdma probe` and the kernel lane's RoCE failover proof."""
