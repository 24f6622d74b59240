"""How many tokens to draft: γ's one form, the cost book (offline and live timings, one cache), the
acceptance evidence and the policy that sizes every row from them. Drafters propose; this decides."""
