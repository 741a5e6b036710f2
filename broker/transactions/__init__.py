"""Transactions: the broker as its own transaction coordinator (docs/transactions.md).

`state` holds the transactional ids, their transitions and which requests they
accept (pure), `log` the coordinator's durable log, and `coordinator` orders the
IO around them: InitProducerId for transactional ids, EndTxn, PrepareTxn,
CommitTxns and timeouts; `recovery` finishes what a crash left, before serving.
The aborted-transaction index of each partition is storage's.
Other domains import from here, not from the modules.
"""

from broker.transactions.coordinator import TransactionCoordinator
from broker.transactions.log import TxnLog
from broker.transactions.state import TXN_ABORT_CAUSES, TxnStats

__all__ = ["TXN_ABORT_CAUSES", "TransactionCoordinator", "TxnLog", "TxnStats"]
