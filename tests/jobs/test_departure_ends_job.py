"""Whole jobs where one rank ends its program while another still calls collectives (issue 25):
the caller raises RingletError at once instead of waiting forever, and the job ends. This is
the pattern that hung Horovod's own test_torch.py run as one job. Plain pytest, not mpirun."""

from __future__ import annotations

from test_failures import LOOP, launch


def test_one_more_allreduce_after_the_other_rank_ended_raises_and_ends_the_job() -> None:
    code, output, seconds = launch(LOOP + """
    if ringlet.rank() == 0:
        ringlet.allreduce(x, out=x)  # rank 1 has ended its program: nobody to reduce with
    """)
    # Uncaught, the error ends the job (the exception hook aborts it), well before any timeout.
    assert code != 0 and seconds < 30, (code, seconds, output)
    assert "RingletError: rank 1 has shut down ringlet" in output, output
    assert "while this rank waits in allreduce #" in output, output


def test_a_rank_that_catches_the_error_goes_on_and_the_job_ends_cleanly() -> None:
    code, output, seconds = launch(LOOP + """
    if ringlet.rank() == 0:
        for call in range(3):  # as a test suite would: each test's error is caught
            started = time.monotonic()
            try:
                ringlet.allreduce(x, out=x)
            except ringlet.RingletError as error:
                print(f"call {call} raised after {time.monotonic() - started:.1f} s: {error}",
                      flush=True)
    """, ranks=3)
    assert code == 0 and seconds < 30, (code, seconds, output)
    raised = [line for line in output.splitlines() if line.startswith("call ")]
    assert len(raised) == 3, output
    for line in raised:
        took = float(line.split(" raised after ")[1].split(" s:")[0])
        assert took < 5 and "has shut down ringlet" in line, line
