"""A budget a pool cannot exceed: ``Options(max_cost_usd)`` on a priced Local pool.

``sky.Local(usd_per_hour=360)`` makes each Local node cost $0.10 a second (a pretend price, to
try budgets on this machine), so a $4 budget lasts about 40 seconds from the node's launch
(its resource created; its bootstrap is billed, as a cloud bills it).
The pool warns at 80 %; at 100 % it is closed and destroyed, and the call still running fails
with ``sky.BudgetExceededError``, which names the budget. Had this script been killed, the
node would have stopped itself at the same deadline (its watchdog was told it).
"""

import time

import skyward_iac as sky


@sky.function
def train(seconds: float) -> str:
    time.sleep(seconds)
    return "trained"


if __name__ == "__main__":
    compute = sky.Compute(provider=sky.Local(usd_per_hour=360), nodes=1,
                          options=sky.Options(max_cost_usd=4))
    compute.on(sky.BudgetWarning, lambda event: print(
        f"warned at ${event.spent_usd:.2f} of ${event.budget_usd:g}", flush=True))
    stopped = None
    with compute as pool:
        print("a short run:", train(0.1) >> pool, flush=True)
        try:
            train(600) >> pool  # far longer than the budget allows
        except sky.BudgetExceededError as error:
            stopped = error
    assert stopped is not None
    print(f"the budget ended the pool at ${stopped.spent_usd:.2f} of ${stopped.budget_usd:g}")
    print("stopped by the budget:", "max_cost_usd=4" in str(stopped))
