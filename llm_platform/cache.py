"""One Redis connection pool per process for Django's cache.

Django keeps cache backends per context (`caches` is an asgiref Local that is not
thread-critical): under ASGI every request gets a fresh RedisCache, and with it a fresh
connection pool, so each API request (django-ratelimit counts in the cache) opened a new
Redis connection (plus its handshake), which stayed open until the garbage collector found the
pool: ~300 connections and 10 new ones a second under a 10 requests/s burst here. Django's
RedisCache takes its pool class from OPTIONS["pool_class"]; this one hands every backend
instance the process's pool for the same URL and options. The pool is a blocking one
(REDIS_POOL_MAX_SIZE connections, a wait of up to REDIS_POOL_TIMEOUT_SECONDS for a free one);
the socket timeouts come from CACHES' OPTIONS, and the library version each connection reports
(CLIENT SETINFO) is resolved once, as for the platform's other clients
(llm_platform.redis_clients.driver_info).
"""
from __future__ import annotations

import os
import threading

import redis
from django.conf import settings

from llm_platform.redis_clients import driver_info

_pools: dict[str, redis.ConnectionPool] = {}
_lock = threading.Lock()


class SharedConnectionPool(redis.ConnectionPool):
    @classmethod
    def from_url(cls, url: str, **kwargs) -> redis.ConnectionPool:
        key = f"{os.getpid()}|{url}|{sorted((k, repr(v)) for k, v in kwargs.items())}"
        with _lock:
            pool = _pools.get(key)
            if pool is None:
                kwargs.setdefault("max_connections", settings.REDIS_POOL_MAX_SIZE)
                kwargs.setdefault("timeout", settings.REDIS_POOL_TIMEOUT_SECONDS)
                kwargs.setdefault("driver_info", driver_info())
                pool = _pools[key] = redis.BlockingConnectionPool.from_url(url, **kwargs)
            return pool
