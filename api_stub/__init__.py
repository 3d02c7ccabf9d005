"""What a caller imports: MemoryClient (add_episode, add_episodes, wait, ...). Importing it is light."""

from api_stub.client import EpisodeReceipt, EpisodeState, ForgetReport, MemoryClient
from worker.errors import EpisodeRejected, QueryRejected, QueueFull
from worker.models import MemoryContext

__all__ = [
    "EpisodeReceipt",
    "EpisodeRejected",
    "EpisodeState",
    "ForgetReport",
    "MemoryClient",
    "MemoryContext",
    "QueryRejected",
    "QueueFull",
]
