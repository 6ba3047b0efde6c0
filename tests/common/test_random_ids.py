"""common.random_ids: ids that never repeat across calls, threads or a fork, in the shape
`uuid4().hex` had (32 lowercase hex digits)."""
import os
import re
import threading

from common import random_ids
from common.random_ids import random_hex

HEX32 = re.compile(r"[0-9a-f]{32}")


def test_ids_are_32_hex_digits_and_never_repeat_across_refills():
    ids = [random_hex() for _ in range(random_ids._BUFFER_IDS * 3 + 7)]  # several buffers
    assert all(HEX32.fullmatch(i) for i in ids)
    assert len(set(ids)) == len(ids)


def test_threads_take_bytes_of_their_own():
    per_thread: list[list[str]] = [[] for _ in range(4)]
    start = threading.Barrier(4)

    def take(out):
        start.wait()
        out.extend(random_hex() for _ in range(1000))
    threads = [threading.Thread(target=take, args=(out,)) for out in per_thread]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    everything = [i for out in per_thread for i in out]
    assert len(set(everything)) == 4000


def test_a_forked_child_does_not_repeat_its_parents_next_ids():
    random_hex()  # the parent's buffer holds bytes not handed out yet
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its next ids, then exit without running the test session's code
        os.close(read)
        os.write(write, ",".join(random_hex() for _ in range(5)).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = pipe.read().split(",")
    os.waitpid(pid, 0)
    parent = [random_hex() for _ in range(5)]
    assert len(child) == 5 and not set(child) & set(parent)
