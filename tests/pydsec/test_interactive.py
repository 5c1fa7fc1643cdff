"""Interactive execs against a real `dsec serve`: streams that start with the process, and streamed stdin.

No timing assertions: a command that waits on something the test controls proves that the stream began before
the command printed anything (the test can only release it after exec_stream returned)."""

import time
import uuid

import pytest

import pydsec


@pytest.fixture
def sb(client, dsec):
    box = client.create(image=dsec.image, labels={"suite": "pydsec-interactive", "test": uuid.uuid4().hex[:8]})
    try:
        yield box
    finally:
        box.destroy()


def test_exec_stream_begins_when_the_command_starts(sb):
    # Silent until the test creates /tmp/go, which it can only do once exec_stream has returned: a node that held
    # the response back until the first output would leave this waiting until the exec's timeout.
    stream = sb.exec_stream("while [ ! -e /tmp/go ]; do sleep 0.05; done; echo released", timeout=60)
    assert stream.started
    sb.write_file("/tmp/go", b"")
    assert list(stream) == [("stdout", "released\n")]
    assert stream.result.exit_code == 0 and not stream.result.timed_out


def test_streamed_stdin_is_echoed_while_running(sb):
    with sb.exec_stream("cat", stdin=True, timeout=60) as stream:
        assert stream.started and stream.exec_id
        assert stream.stdin.write(b"first line\n") == len(b"first line\n")
        # cat answers before stdin is closed: the command is interactive, not fed a buffered body.
        assert next(stream) == ("stdout", "first line\n")
        stream.stdin.write("second\n")
        assert next(stream) == ("stdout", "second\n")
        stream.stdin.close()  # EOF ends cat
        result = stream.wait()
    assert result.exit_code == 0 and result.stdout == "first line\nsecond\n"


def test_streamed_stdin_eof_and_binary(sb):
    stream = sb.exec_stream(["sh", "-c", "wc -c; echo done >&2"], stdin=True, timeout=60)
    payload = bytes(range(256)) * 4096  # 1 MiB: several writes, each waited for by the pipe
    assert stream.stdin.write(payload) == len(payload)
    stream.stdin.close()
    result = stream.wait()
    assert result.exit_code == 0 and result.stdout.strip() == str(len(payload)) and result.stderr == "done\n"


def test_stdin_write_after_exit_and_after_eof(sb):
    stream = sb.exec_stream("head -c 3", stdin=True, timeout=60)
    stream.stdin.write(b"abc")
    result = stream.wait()
    assert result.stdout == "abc"
    with pytest.raises((pydsec.ConflictError, pydsec.NotFoundError)):
        stream.stdin.write(b"more")
    other = sb.exec_stream("cat", stdin=True, timeout=60)
    other.stdin.close()
    with pytest.raises(ValueError):
        other.stdin.write(b"x")
    assert other.wait().exit_code == 0


def test_stdin_write_over_the_buffer_cap_is_refused(sb):
    stream = sb.exec_stream("cat >/dev/null", stdin=True, timeout=60)
    route = sb._d()
    with pytest.raises(pydsec.TooLargeError):
        route.request("POST", f"/v1/sandboxes/{sb.id}/exec/{stream.exec_id}/stdin", body=b"x" * (2 << 20),
                      headers={"Content-Type": "application/octet-stream"})
    with pytest.raises(pydsec.NotFoundError):
        route.request("POST", f"/v1/sandboxes/{sb.id}/exec/{'0' * 24}/stdin", body=b"x")
    stream.stdin.close()
    assert stream.wait().exit_code == 0


def test_stdin_stream_needs_the_streamed_route(sb):
    with pytest.raises(pydsec.InvalidRequestError):
        sb._d().call("POST", f"/v1/sandboxes/{sb.id}/exec", payload={"cmd": "cat", "stdin_stream": True})


def test_aio_streamed_stdin(dsec):
    import asyncio

    import pydsec.aio

    async def main():
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token) as c:
            async with c.create(image=dsec.image, labels={"suite": "aio-interactive"}) as box:
                async with box.exec_stream("cat", stdin=True, timeout=60) as stream:
                    assert stream.started and stream.exec_id
                    await stream.stdin.write(b"ping\n")
                    assert await stream.__anext__() == ("stdout", "ping\n")
                    await stream.stdin.write("pong\n")
                    assert await stream.__anext__() == ("stdout", "pong\n")
                    await stream.stdin.close()
                    result = await stream.wait()
                assert result.exit_code == 0 and result.stdout == "ping\npong\n"
                # Many at once on one loop: each stream holds its connections, no thread.
                streams = [box.exec_stream(["sh", "-c", "wc -c"], stdin=True, timeout=60) for _ in range(8)]
                for s in streams:
                    await s.start()
                await asyncio.gather(*(s.stdin.write(b"x" * (i + 1)) for i, s in enumerate(streams)))
                await asyncio.gather(*(s.stdin.close() for s in streams))
                results = await asyncio.gather(*(s.wait() for s in streams))
                assert [r.stdout.strip() for r in results] == [str(i + 1) for i in range(8)]

    asyncio.run(main())


# -- terminals -------------------------------------------------------------------------------------------------


def test_terminal_is_a_pty_of_the_sandbox_and_follows_resize(sb):
    with sb.terminal(["sh"], rows=30, cols=100, timeout=120) as term:
        term.send("tty; stty size; echo mark-$((6*7))\n")
        out = term.read_until("mark-42").decode()
        assert "/dev/pts/" in out and "30 100" in out
        term.resize(40, 132)
        term.send("stty size; echo mark-$((6*8))\n")
        assert "40 132" in term.read_until("mark-48").decode()
        term.send("exit 5\n")
        assert term.wait()["exit_code"] == 5 and term.exit_code == 5


def test_terminal_signal_reaches_the_foreground_job(sb):
    with sb.terminal(["sh", "-i"], timeout=120) as term:
        # The foreground job runs until the test signals it (once it is seen running); the shell survives.
        term.send("sleep 300\n")
        while not sb.exec("pidof sleep").ok:
            pass
        term.signal("INT")
        term.send("echo status-$?\n")
        term.read_until("status-130")
        term.send("exit 0\n")
        assert term.wait()["exit_code"] == 0


def test_terminal_eof_and_kill(sb):
    with sb.terminal(["cat"], timeout=120) as term:
        term.send("typed\n")
        assert b"typed" in term.read_until("typed")
        term.eof()
        assert term.wait()["exit_code"] == 0
    with sb.terminal(["sleep", "300"], timeout=120) as term:
        term.signal("KILL")
        exit = term.wait()
        assert exit["signal"] == 9 and exit["exit_code"] == 137


def test_terminal_timeout_and_bad_requests(sb):
    with sb.terminal(["sleep", "300"], timeout=1) as term:
        assert term.wait()["timed_out"]
    with pytest.raises(ValueError):
        sb.terminal(rows=0)
    with sb.terminal(["/no/such/program"]) as term:
        assert term.wait()["exit_code"] == 127  # as a shell reports it


def test_pause_and_destroy_end_terminals(client, dsec):
    box = client.create(image=dsec.image, labels={"suite": "pydsec-interactive"})
    try:
        term = box.terminal(["sh"], timeout=120)
        term.send("echo up\n")
        term.read_until("up")
        box.pause()
        exit = term.wait(timeout=30)
        assert exit["signal"] == 9
        box.resume()
        term = box.terminal(["sh"], timeout=120)
        term.send("echo up\n")
        term.read_until("up")
    finally:
        box.destroy()
    assert term.wait(timeout=30)["exit_code"] != 0


def test_dsec_shell_through_a_pty(sb, dsec):
    """`dsec shell` as a user runs it: on a terminal of ours (a pty the test holds), raw mode while it runs and
    restored after, our window size and its changes (SIGWINCH) passed on, the command's exit code."""
    import fcntl
    import os
    import select
    import struct
    import termios

    master, slave = os.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 30, 90, 0, 0))
    before = termios.tcgetattr(slave)
    env = dict(os.environ, DSEC_ENDPOINT=dsec.endpoint, DSEC_TOKEN=dsec.token, TERM="xterm")
    pid = os.fork()
    if pid == 0:  # the child: a session whose controlling terminal is the pty, as in a real terminal
        try:
            os.setsid()
            fcntl.ioctl(slave, termios.TIOCSCTTY, 0)
            for fd in (0, 1, 2):
                os.dup2(slave, fd)
            os.execve(dsec.bin, [dsec.bin, "shell", sb.id, "--", "sh"], env)
        finally:
            os._exit(127)
    out = bytearray()

    def read_until(marker: bytes) -> bytes:
        start = len(out)
        while marker not in out[start:]:
            ready, _, _ = select.select([master], [], [], 60)
            assert ready, f"no {marker!r} from dsec shell; got {bytes(out[start:])!r}"
            try:
                data = os.read(master, 65536)
            except OSError:
                data = b""
            assert data, f"dsec shell ended before {marker!r}; got {bytes(out[start:])!r}"
            out.extend(data)
        return bytes(out[start:])

    try:
        read_until(b"# ")  # the shell's prompt: dsec has the terminal in raw mode by then
        os.write(master, b"stty size; tty; echo m-$((1+1))\n")
        got = read_until(b"m-2").decode(errors="replace")
        assert "30 90" in got and "/dev/pts/" in got
        assert not termios.tcgetattr(slave)[3] & termios.ICANON  # raw mode while it runs
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 120, 0, 0))  # dsec gets SIGWINCH
        os.write(master, b"stty size; echo m-$((2+1))\n")
        assert "50 120" in read_until(b"m-3").decode(errors="replace")
        os.write(master, b"exit 4\n")
        _, status = os.waitpid(pid, 0)
        pid = 0
        assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 4
        assert termios.tcgetattr(slave) == before  # the terminal is as dsec found it
    finally:
        if pid:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
        os.close(master)
        os.close(slave)


def test_aio_terminal(dsec):
    import asyncio

    import pydsec.aio

    async def main():
        async with pydsec.aio.Client(endpoint=dsec.endpoint, token=dsec.token) as c:
            async with c.create(image=dsec.image, labels={"suite": "aio-interactive"}) as box:
                async with await box.terminal(["sh"], rows=20, cols=60, timeout=60) as term:
                    await term.send("stty size; echo m-$((3*3))\n")
                    assert "20 60" in (await term.read_until("m-9")).decode()
                    await term.resize(21, 61)
                    await term.send("stty size; exit 6\n")
                    exit = await term.wait()
                    assert exit["exit_code"] == 6 and "21 61" in term.output.decode()

    asyncio.run(main())


def test_a_silent_stream_whose_client_left_kills_its_command(client, sb):
    # The command prints its start and then nothing: only the connection's close can tell the node its client went.
    stream = sb.exec_stream("echo up; exec sleep 600", timeout=900)
    assert next(stream) == ("stdout", "up\n")
    stream.close()
    gone = False
    for _ in range(200):
        if "sleep 600" not in sb.exec("ps -o args").stdout:
            gone = True
            break
        time.sleep(0.05)
    assert gone, "the command of a stream whose client left is still running"


def test_a_streamed_exec_with_an_id_takes_a_signal(sb):
    # POST .../exec/{exec_id}/signal (docs/api.md): what E2B's commands.kill(pid) becomes on dsec's E2B listener.
    stream = sb.exec_stream("trap 'echo got-term; exit 7' TERM; echo ready; while true; do sleep 0.1; done",
                            stdin=True, timeout=60)
    assert next(stream) == ("stdout", "ready\n")
    path = sb._path + f"/exec/{stream.exec_id}/signal"
    with pytest.raises(pydsec.InvalidRequestError):
        sb._t().call("POST", path, payload={"signal": 0})
    assert sb._t().call("POST", path, payload={"signal": 15}) == {"signal": 15}
    result = stream.wait()
    assert result.exit_code == 7 and "got-term" in result.stdout, result
    with pytest.raises(pydsec.NotFoundError):  # the exec ended: nothing left to signal
        sb._t().call("POST", path, payload={"signal": 15})
