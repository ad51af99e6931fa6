"""Bad input: one clear message saying what was wrong and what to do."""


class ConfigError(Exception):
    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}. {fix}.")
        self.problem, self.fix = problem, fix

    def __reduce__(self):   # raised in a rung's child process, raised again in the sweep
        return ConfigError, (self.problem, self.fix)


class SweepInterrupted(Exception):
    """The sweep stopped at a user's request after recording its last step; running it again resumes it."""


def exception_line(exc: BaseException) -> str:
    """`Type: the message's last line`: a failure's own words, without a traceback's frames or carets."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    return f"{type(exc).__name__}: {lines[-1][:400]}" if lines else type(exc).__name__
