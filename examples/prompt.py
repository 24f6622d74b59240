def binary_search(items, target):
    """Return the index of target in the sorted list items, or -1 if absent."""
