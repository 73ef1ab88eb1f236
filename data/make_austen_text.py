"""Extract data/pride_and_prejudice.txt from Debian's r-cran-janeaustenr package, with no R and no extra Python.

Run once by a maintainer, on a Debian machine (the course itself only reads the text file):

    apt-get download r-cran-janeaustenr          # version 1.0.0-1 gave the shipped file
    dpkg-deb -x r-cran-janeaustenr_1.0.0-1_all.deb pkg
    python data/make_austen_text.py pkg/usr/lib/R/site-library/janeaustenr

The package keeps each novel as an R character vector (one element per line of the Project
Gutenberg text) in R's lazy-load database ``data/Rdata.rdb``, indexed by ``data/Rdata.rdx``. Both
hold R's XDR serialisation; the small reader below understands the part of it these files use.
The lines are joined with newlines and written as UTF-8 with a final newline.
"""

import argparse
import gzip
import hashlib
import struct
import zlib
from pathlib import Path

NOVEL = "prideprejudice"
OUT = Path(__file__).with_name("pride_and_prejudice.txt")


class RReader:
    """Unserialise R's XDR format (``serialize(xdr=TRUE)``): enough for lists, vectors and strings."""

    def __init__(self, data: bytes):
        self.data, self.pos, self.refs = data, 0, []
        if self.take(2) != b"X\n":
            raise ValueError("not R's XDR serialisation")
        version = self.int()
        self.int(), self.int()  # the writer's R version and the oldest that can read it
        if version == 3:
            self.take(self.int())  # native encoding name

    def take(self, n: int) -> bytes:
        chunk = self.data[self.pos:self.pos + n]
        self.pos += n
        return chunk

    def int(self) -> int:
        return struct.unpack(">i", self.take(4))[0]

    def length(self) -> int:
        n = self.int()
        return n if n != -1 else (self.int() << 32) + self.int()

    def item(self):
        flags = self.int()
        kind, has_attr, has_tag = flags & 0xFF, flags & (1 << 9), flags & (1 << 10)
        if kind == 254:                       # NULL
            return None
        if kind in (242, 241, 253):           # empty, base and global environments
            return f"<env {kind}>"
        if kind == 255:                       # a reference to an earlier symbol
            index = flags >> 8 or self.int()
            return self.refs[index - 1]
        if kind == 1:                         # symbol
            name = self.item()
            self.refs.append(name)
            return name
        if kind in (2, 6):                    # pairlist (attributes, lists of tags)
            if has_attr:
                self.item()                   # a pairlist's own attributes: not needed here
            tag = self.item() if has_tag else None
            head, tail = self.item(), self.item()
            return [(tag, head)] + (tail or [])
        if kind == 9:                         # one string
            n = self.int()
            return None if n == -1 else self.take(n).decode("utf-8")
        if kind in (10, 13):                  # logical, integer
            value = list(struct.unpack(f">{(n := self.length())}i", self.take(4 * n)))
        elif kind == 14:                      # double
            value = list(struct.unpack(f">{(n := self.length())}d", self.take(8 * n)))
        elif kind in (16, 19, 20):            # character vector, list, expression
            value = [self.item() for _ in range(self.length())]
        else:
            raise ValueError(f"R type {kind} at byte {self.pos - 4} is not handled by this reader")
        if has_attr:
            attrs = dict(self.item())
            if "names" in attrs and kind == 19:
                return dict(zip(attrs["names"], value, strict=True))
        return value


def novel_lines(package: Path, name: str) -> list[str]:
    """The lines of one novel from the package's lazy-load database."""
    index = RReader(gzip.open(package / "data" / "Rdata.rdx").read()).item()
    offset, size = index["variables"][name]
    blob = (package / "data" / "Rdata.rdb").read_bytes()[offset:offset + size]
    raw = zlib.decompress(blob[4:])  # 4 bytes of uncompressed length, then a zlib stream
    if len(raw) != struct.unpack(">I", blob[:4])[0]:
        raise ValueError(f"{name}: the entry decompressed to the wrong length")
    return RReader(raw).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", type=Path, help="the installed janeaustenr folder (holds DESCRIPTION)")
    args = parser.parse_args()
    if not (args.package / "data" / "Rdata.rdb").is_file():
        parser.error(f"{args.package} has no data/Rdata.rdb: pass the janeaustenr folder of the unpacked package")
    lines = novel_lines(args.package, NOVEL)
    OUT.write_text("\n".join(lines) + "\n", encoding="utf-8")
    data = OUT.read_bytes()
    print(f"wrote {OUT} ({len(lines)} lines, {len(data)} bytes, sha256 {hashlib.sha256(data).hexdigest()})")


if __name__ == "__main__":
    main()
