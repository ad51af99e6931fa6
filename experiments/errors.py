"""Bad input: one clear message saying what was wrong and what to do."""


class ConfigError(Exception):
    def __init__(self, problem: str, fix: str):
        super().__init__(f"{problem}. {fix}.")
        self.problem, self.fix = problem, fix
