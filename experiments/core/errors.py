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
    """`Type: the message's first line … its last line`: a failure's own words, without a traceback's frames or
    carets. The first line says what failed (a build step: what it was making and which command refused), the last
    the cause a tool printed at the end of its log; either alone can be a bare class name ("AssertionError")."""
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    first, last = lines[0][:400], lines[-1][:400]
    return f"{type(exc).__name__}: {first}" + (f" … {last}" if len(lines) > 1 and last not in first else "")
