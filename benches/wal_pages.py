#!/usr/bin/env python3
"""Which tables' pages the last transactions of a durable store wrote.

Reads the frame headers of a copy of a store's WAL (each frame is one page
written by one transaction; a frame with a database size set ends its
transaction) and maps each page number to the table or index that owns it
through SQLite's `dbstat` over a copy of the database file without the WAL.
Pages the database file did not hold yet (allocated since the last
checkpoint) are counted as `new`.

    # while a durable server is under load (its data directory DIR):
    cp DIR/toolgate.sqlite3-wal COPY/; cp DIR/toolgate.sqlite3 COPY/
    python3 benches/wal_pages.py COPY [--last 40]

Copies taken while the server writes need not be consistent: only the
frame headers and the owners of pages already in the file are read.
"""

import argparse
import collections
import shutil
import sqlite3
import struct
import sys
import tempfile
from pathlib import Path

WAL_HEADER = struct.Struct(">IIIIIIII")
FRAME_HEADER = struct.Struct(">IIII")


def transactions(wal: bytes):
    """The page numbers each transaction in `wal` wrote, oldest first."""
    _magic, _version, page_size, _seq, salt1, salt2, _c1, _c2 = WAL_HEADER.unpack_from(wal)
    frame = 24 + page_size
    done, current = [], []
    offset = WAL_HEADER.size
    while offset + frame <= len(wal):
        page, size_after, frame_salt1, frame_salt2 = FRAME_HEADER.unpack_from(wal, offset)
        if (frame_salt1, frame_salt2) != (salt1, salt2):
            break  # left over from before the WAL last restarted
        current.append(page)
        if size_after:
            done.append(current)
            current = []
        offset += frame
    return page_size, done


def owners(database: Path):
    """(table or index, page type) of every page of `database`."""
    with tempfile.TemporaryDirectory() as scratch:
        copy = Path(scratch) / "db"
        shutil.copyfile(database, copy)
        connection = sqlite3.connect(f"file:{copy}?mode=ro", uri=True)
        rows = connection.execute("SELECT pageno, name, pagetype FROM dbstat")
        found = {page: (name, kind) for page, name, kind in rows}
        connection.close()
        return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("copy", type=Path, help="a directory with copies of toolgate.sqlite3 and its -wal")
    parser.add_argument("--last", type=int, default=40, help="transactions counted, the latest (default 40)")
    args = parser.parse_args()
    wal = (args.copy / "toolgate.sqlite3-wal").read_bytes()
    page_size, done = transactions(wal)
    if not done:
        print("no complete transaction in the WAL", file=sys.stderr)
        return 1
    last = done[-args.last :]
    page_owner = owners(args.copy / "toolgate.sqlite3")
    counts = collections.Counter()
    for pages in last:
        for page in pages:
            counts[page_owner.get(page, ("new", "-"))] += 1
    frames = sum(len(pages) for pages in last)
    print(f"page size {page_size}; {len(done)} transactions in the WAL, the last {len(last)} counted")
    print(f"pages written per transaction: {frames / len(last):.1f}")
    for (name, kind), count in counts.most_common():
        print(f"  {name:<20} {kind:<9} {count / len(last):6.1f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
