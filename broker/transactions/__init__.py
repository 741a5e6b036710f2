"""Transactions: the broker as its own transaction coordinator (docs/transactions.md).

`state` holds the transactional ids and their transitions (pure), `log` the
coordinator's durable log, and `coordinator` orders the IO around them:
InitProducerId for transactional ids, EndTxn, PrepareTxn, CommitTxns, timeouts
and recovery. The aborted-transaction index of each partition is storage's.
Other domains import from here, not from the modules.
"""

from broker.transactions.coordinator import TransactionCoordinator
from broker.transactions.log import TxnLog

__all__ = ["TransactionCoordinator", "TxnLog"]
