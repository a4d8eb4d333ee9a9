"""Stand-ins for the application's own things that the docs' Python fragments use
(`batches`, `db`, `data`, `write`, `do_work`, `work`). tests/client_doc_examples.rs puts
a fragment in place of the EXAMPLE line, checks the whole with `mypy --strict` and runs
it against a sidecar ($LOCKSIDE_ADDR)."""

import asyncio

batches: list[bytes] = [b"first batch", b"second batch"]
data = b"the report"


class Db:
    """A resource that takes the fencing token with every write."""

    def write(self, batch: bytes, *, fencing_token: int) -> None:
        print("wrote", batch, "with fencing token", fencing_token)


class AsyncDb:
    """The same, written to from asyncio."""

    async def write(self, batch: bytes, *, fencing_token: int) -> None:
        await asyncio.sleep(0)
        print("wrote", batch, "with fencing token", fencing_token)


db = Db()
adb = AsyncDb()


def write(data: bytes, *, fencing_token: int) -> None:
    db.write(data, fencing_token=fencing_token)


async def do_work(fencing_token: int) -> None:
    await adb.write(data, fencing_token=fencing_token)


def work(*, fencing_token: int) -> None:
    db.write(data, fencing_token=fencing_token)


# EXAMPLE
