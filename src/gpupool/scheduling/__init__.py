"""The scheduler: a pure function from a frozen cluster snapshot to a decision."""
