"""What a caller imports: MemoryClient (add_episode, add_episodes, wait, ...). Importing it is light."""

from api_stub.client import EpisodeReceipt, EpisodeState, MemoryClient
from worker.errors import EpisodeRejected

__all__ = ["EpisodeReceipt", "EpisodeRejected", "EpisodeState", "MemoryClient"]
