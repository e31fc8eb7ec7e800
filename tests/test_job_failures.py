"""A failed job says what failed: the remote exception, not only Ray's wrapper."""
from __future__ import annotations


def test_a_failed_jobs_message_names_the_remote_exception_that_caused_it():
    from pipeline.failures import JobFailedError

    remote = RuntimeError("ray::MapWorker.submit() (pid=1)\nTraceback ...\n  File \"x.py\", line 3\n"
                          "AttributeError: 'Model' object has no attribute 'compiled'\n"
                          "ray.exceptions.UserCodeException: UDF failed to process a data block.")
    message = str(JobFailedError(remote, []))
    assert message.startswith("RuntimeError: ray::MapWorker.submit() (pid=1)")
    assert message.endswith("caused by AttributeError: 'Model' object has no attribute 'compiled'")
