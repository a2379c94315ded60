"""history.py - reads a devio-server's SQLite file the way an operator would, beside the server.

    from history import db_rows
    db_rows(server.db, "SELECT id, status FROM tickets")
"""
import sqlite3


def db_rows(path, sql, args=()):
    """Every row of one query, on a connection of its own (closed after)."""
    con = sqlite3.connect(str(path), timeout=10)
    try:
        return con.execute(sql, args).fetchall()
    finally:
        con.close()
