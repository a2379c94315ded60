"""history.py - reads a devio-server's SQLite file the way an operator would, beside the server,
and waits (bounded) for what a server does on its own time.

    from history import db_rows, wait_until
    db_rows(server.db, "SELECT id, status FROM tickets")
    wait_until(lambda: c.facts()["tickets_in_flight"] == 0)
"""
import sqlite3
import time


def db_rows(path, sql, args=()):
    """Every row of one query, on a connection of its own (closed after)."""
    con = sqlite3.connect(str(path), timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()


def wait_until(fn, timeout=10.0, every=0.02):
    """fn() until it is truthy or timeout passes; its last value."""
    deadline = time.monotonic() + timeout
    v = fn()
    while not v and time.monotonic() < deadline:
        time.sleep(every)
        v = fn()
    return v
