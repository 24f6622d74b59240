"""The hand-written prompts of the real workload (chat, edit, reasoning), written for this project.

Data only: ``bench/real.py`` turns them into ``workloads/real-v1.jsonl``. They were
written here and published nowhere else, so no public training set can hold them;
``bench/heldout.py`` checks a given corpus all the same. Edit passages are copied
almost verbatim into the answer, which is what prompt lookup and suffix drafting
feed on; reasoning problems want long step-by-step chains.
"""

from __future__ import annotations

# Open questions, one user turn each, except two short conversations: (turns, budget).
CHAT: list[tuple[tuple[str, ...], int]] = [
    (("What are the main differences between a virus and a bacterium, and why do antibiotics only work on one "
      "of them?",), 256),
    (("I have a small balcony that gets about four hours of afternoon sun. Which vegetables or herbs could I "
      "grow there, and how should I start?",), 256),
    (("Explain to a ten-year-old why the sky is blue during the day but red and orange at sunset.",), 256),
    (("What should I consider when choosing between renting and buying a home?",), 256),
    (("Write a short, friendly message I can send to a colleague who is leaving the company after six years.",),
     192),
    (("How does a refrigerator keep food cold? Walk me through the cycle.",), 256),
    (("Give me five ideas for a rainy Sunday afternoon with two kids aged six and nine, none involving screens.",),
     256),
    (("I'm planning a trip to Lisbon in October.", "Lisbon in October is a great choice: the summer crowds are "
      "gone and the weather is usually mild. What would you like help with?",
      "Suggest a three-day itinerary that mixes sightseeing with good places to eat, and say how to get around."),
     320),
    (("What is the difference between weather and climate, and why does the difference matter in debates about "
      "climate change?",), 256),
    (("What habits help people learn a new language as an adult? Be concrete.",), 256),
    (("Compare electric cars and petrol cars for someone who drives about 40 kilometres a day.",), 256),
    (("Why do we have leap years, and what would happen to the calendar without them?",), 256),
    (("Write a haiku about a lighthouse, then explain the imagery you chose.",), 192),
    (("What makes a good code review? List the things a reviewer should look for and the things they should "
      "avoid.",), 320),
    (("Can you recommend a beginner's routine for strength training at home without equipment?",
      "Sure. How many days a week can you train, and do you have any injuries I should know about?",
      "Three days a week, and my left knee sometimes hurts when I run."),
     320),
    (("How do vaccines train the immune system? Mention memory cells.",), 256),
]

# (instruction, passage, fence language or "" for prose): the answer repeats the passage with small changes.
EDIT: list[tuple[str, str, str]] = [
    ("Rename the variable `lst` to `prices` everywhere in this function. Change nothing else and return the "
     "whole function.",
     '''def apply_discount(lst, rate, minimum=0.0):
    """Return a new list with each price reduced by rate, never below minimum."""
    if not 0 <= rate < 1:
        raise ValueError("rate must be in [0, 1)")
    out = []
    for i in range(len(lst)):
        reduced = lst[i] * (1 - rate)
        if reduced < minimum:
            reduced = minimum
        out.append(round(reduced, 2))
    total_before = sum(lst)
    total_after = sum(out)
    print(f"saved {total_before - total_after:.2f} on {len(lst)} items")
    return out
''', "python"),
    ("This function has an off-by-one bug: it never looks at the last element. Fix it and return the corrected "
     "code.",
     '''function findLongestRun(values) {
  if (values.length === 0) {
    return { start: -1, length: 0 };
  }
  let bestStart = 0;
  let bestLength = 1;
  let runStart = 0;
  for (let i = 1; i < values.length - 1; i++) {
    if (values[i] !== values[i - 1]) {
      runStart = i;
    }
    const runLength = i - runStart + 1;
    if (runLength > bestLength) {
      bestLength = runLength;
      bestStart = runStart;
    }
  }
  return { start: bestStart, length: bestLength };
}
''', "javascript"),
    ("Convert every camelCase name in this code to snake_case, following PEP 8. Keep the logic identical.",
     '''class InventoryTracker:
    def __init__(self, warehouseName):
        self.warehouseName = warehouseName
        self.itemCounts = {}

    def addItems(self, itemName, itemCount):
        currentCount = self.itemCounts.get(itemName, 0)
        self.itemCounts[itemName] = currentCount + itemCount

    def removeItems(self, itemName, itemCount):
        currentCount = self.itemCounts.get(itemName, 0)
        if itemCount > currentCount:
            raise ValueError(f"only {currentCount} of {itemName} in stock")
        self.itemCounts[itemName] = currentCount - itemCount

    def totalItems(self):
        return sum(self.itemCounts.values())
''', "python"),
    ("Add type hints to every function signature in this module. Do not change the bodies.",
     '''import csv
from collections import defaultdict


def read_rows(path, delimiter=","):
    with open(path, newline="") as fh:
        return list(csv.DictReader(fh, delimiter=delimiter))


def group_by(rows, key):
    groups = defaultdict(list)
    for row in rows:
        groups[row[key]].append(row)
    return dict(groups)


def column_sum(rows, column):
    return sum(float(row[column]) for row in rows if row[column])


def summarize(path, key, column):
    groups = group_by(read_rows(path), key)
    return {name: column_sum(members, column) for name, members in groups.items()}
''', "python"),
    ("Rewrite this message in a formal, professional tone suitable for a client. Keep every fact.",
     """Hey team,

So the server thing last night was a mess. Around 11pm the database ran out of disk and everything just stopped
for like 40 minutes. Nobody lost any data, which is great, but a bunch of customers couldn't log in and a few
orders got stuck. We cleaned up old logs, added more disk, and set up an alert so we hear about it way before it
fills up again. Also we're going to move the logs to their own volume next week so this can't happen the same way.
Sorry about the hassle, and ping me if anything looks off today.

Cheers,
Dana
""", ""),
    ("Correct the spelling and grammar mistakes in this text. Change nothing else.",
     """Their are many reason why people choose to work from home. For some, the daily commute take more then an
hour each way, and cutting it out give them back time for family and exercise. Others finds that they can
concentrate better without the constant interruptions of an open office. However, working remotly is not
without it's problems. Many workers reports feeling isolated, and it can be difficult to seperate work from
personal life when both happens in the same room. Managers, for they're part, sometimes struggles to judge
performance when they can not see there team. The most succesful companies is those that sets clear
expectations and trust there employees.
""", ""),
    ("Turn this list into a Markdown table with the columns Name, Role, Office and Start date.",
     """- Maria Gonzalez, backend engineer, Madrid office, started 2019-03-04
- Tom Becker, product manager, Berlin office, started 2021-07-19
- Aiko Tanaka, data scientist, Tokyo office, started 2020-01-13
- Samuel Okafor, site reliability engineer, Lagos office, started 2022-09-01
- Chloe Martin, designer, Paris office, started 2018-11-26
- Rahul Mehta, frontend engineer, Bangalore office, started 2023-02-06
- Ingrid Larsen, engineering manager, Oslo office, started 2017-05-15
- Diego Silva, QA engineer, Sao Paulo office, started 2021-10-04
""", ""),
    ("Rename the class `Node` to `TreeNode` and the method `walk` to `traverse`, including every use. Return the "
     "complete file.",
     '''import java.util.ArrayList;
import java.util.List;

public class Node {
    private final String label;
    private final List<Node> children = new ArrayList<>();

    public Node(String label) {
        this.label = label;
    }

    public Node add(Node child) {
        children.add(child);
        return this;
    }

    public void walk(List<String> out, int depth) {
        out.add("  ".repeat(depth) + label);
        for (Node child : children) {
            child.walk(out, depth + 1);
        }
    }

    public static void main(String[] args) {
        Node root = new Node("root").add(new Node("left")).add(new Node("right"));
        List<String> lines = new ArrayList<>();
        root.walk(lines, 0);
        lines.forEach(System.out::println);
    }
}
''', "java"),
    ("Replace every print call with a call on a module-level logger (`logger = logging.getLogger(__name__)`), "
     "choosing info, warning or error to fit each message. Keep everything else as it is.",
     '''import shutil
from pathlib import Path


def backup(source, target_dir, keep=5):
    source = Path(source)
    target_dir = Path(target_dir)
    if not source.exists():
        print(f"source {source} does not exist, nothing to back up")
        return None
    target_dir.mkdir(parents=True, exist_ok=True)
    existing = sorted(target_dir.glob(source.name + ".*.bak"))
    stamp = len(existing) + 1
    target = target_dir / f"{source.name}.{stamp}.bak"
    shutil.copy2(source, target)
    print(f"copied {source} to {target}")
    for old in existing[:-keep + 1] if keep > 1 else existing:
        old.unlink()
        print(f"removed old backup {old}")
    if target.stat().st_size == 0:
        print(f"backup {target} is empty")
    return target
''', "python"),
    ("Reformat this SQL: keywords in upper case, one clause per line, and indent the column list. Do not change "
     "what the query does.",
     """select c.id, c.name, c.country, count(o.id) as order_count, sum(o.total) as revenue, max(o.created_at) as
last_order from customers c left join orders o on o.customer_id = c.id and o.status <> 'cancelled' where
c.created_at >= '2023-01-01' and c.country in ('DE', 'FR', 'IT', 'ES') group by c.id, c.name, c.country having
count(o.id) > 2 order by revenue desc, c.name asc limit 50;
""", "sql"),
    ("Update this configuration: raise the Python version to 3.12, set the replica count to 4, and add an "
     "environment variable LOG_LEVEL with value info to the web service. Return the whole file.",
     """version: "3.9"
services:
  web:
    build:
      context: .
      args:
        PYTHON_VERSION: "3.10"
    image: shop/web:1.8.2
    ports:
      - "8000:8000"
    environment:
      DATABASE_URL: postgres://shop:shop@db:5432/shop
      CACHE_URL: redis://cache:6379/0
    deploy:
      replicas: 2
    depends_on:
      - db
      - cache
  db:
    image: postgres:15
    volumes:
      - db-data:/var/lib/postgresql/data
  cache:
    image: redis:7
volumes:
  db-data:
""", "yaml"),
    ("Rewrite this paragraph in the active voice, keeping the wording otherwise as close to the original as you "
     "can.",
     """The new bridge was opened by the mayor on a cold Tuesday morning. It had been designed by a small firm from
the north of the country, and it was built over three years by a team of more than two hundred workers. Several
delays were caused by floods in the second winter, and the budget was exceeded by about twelve percent. The
final cost was criticised by the opposition, but the bridge was praised by most residents, who had been forced
to take a long detour for decades. On the first day it was crossed by more than ten thousand people.
""", ""),
]

# (problem, budget): 512 tokens for one problem; 2,048 for the long chains that show acceptance over length.
REASONING: list[tuple[str, int]] = [
    ("A bakery sells muffins for $2.50 each and cookies for $1.20 each. On Saturday it sold 84 muffins and three "
     "times as many cookies as muffins. Ingredients cost 40% of the revenue. How much profit did the bakery make "
     "on Saturday?", 512),
    ("Starting from n = 27, apply the Collatz rule step by step (if n is even, halve it; if it is odd, replace it "
     "by 3n + 1) until you reach 1. Write out every step as 'step k: n', and at the end say how many steps it took "
     "and the largest number reached.", 2048),
    ("A train leaves City A at 9:15 travelling at 80 km/h towards City B, 350 km away. A second train leaves City "
     "B at 10:00 travelling towards City A at 100 km/h. At what time do they meet, and how far from City A?", 512),
    ("A tank holds 1,200 litres. Pipe A fills it in 6 hours, pipe B fills it in 4 hours, and a drain empties it "
     "in 8 hours. If the tank starts empty and all three are open, how long does it take to fill? Show each step.",
     512),
    ("Maya borrows $12,000 at 6% annual interest, compounded yearly, and pays back $2,000 at the end of every "
     "year. Make a table year by year (balance at the start, interest, payment, balance at the end) until the "
     "loan is paid off, reasoning through each year's arithmetic, then give the total interest paid.", 2048),
    ("In a class of 30 students, 18 play football, 12 play basketball and 7 play both. How many students play "
     "neither sport? A student is picked at random; what is the probability that they play exactly one sport?",
     512),
    ("A rectangular garden is 3 metres longer than it is wide, and its area is 108 square metres. A path 1 metre "
     "wide is built all around the outside. What is the area of the path?", 512),
    ("Solve these six problems one at a time, step by step, and give each answer on its own line at the end.\n"
     "1. A shirt costs $40 after a 20% discount. What was the original price?\n"
     "2. Three workers paint a fence in 8 hours. How long would four workers take at the same rate?\n"
     "3. The sum of three consecutive even numbers is 138. What are they?\n"
     "4. A car uses 6.5 litres of fuel per 100 km. How much fuel does a 740 km trip need, and what does it cost "
     "at $1.84 per litre?\n"
     "5. A number is doubled, then 7 is added, and the result is 3 less than four times the number. Find it.\n"
     "6. A recipe for 4 people needs 300 g of flour and 2 eggs. How much of each is needed for 10 people?", 2048),
    ("Tom is twice as old as his sister Anna. In 8 years, the sum of their ages will be 52. How old are they now?",
     512),
    ("A shop buys 250 notebooks at $1.80 each. It sells 60% of them at $3.00, then puts the rest on sale at 25% "
     "off. It sells all but 10 of the sale notebooks. What is the shop's profit or loss?", 512),
    ("A clock gains 3 minutes every hour. It is set to the correct time at 6:00 am on Monday. What time does it "
     "show when the correct time is 6:00 pm on Tuesday? When will it next show the correct time?", 512),
    ("Five friends split a restaurant bill of $186. Two of them only had salads and pay $14 each; the others "
     "split the rest equally and add a 15% tip on the whole bill between the three of them. How much does each "
     "of the three pay?", 512),
]
