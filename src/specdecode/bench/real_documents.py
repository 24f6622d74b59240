"""Documents for the real workload's summarize category, written for this project (about 200-400 words each).

Data only, like ``real_prompts.py``: fictional but plausible texts of kinds users
paste into a chat (a meeting record, an incident report, an article, a policy),
so a summary has facts to carry and no public corpus holds the source.
"""

from __future__ import annotations

# (instruction, document, budget)
SUMMARIZE: list[tuple[str, str, int]] = [
    ("Summarize this meeting record in five bullet points, then list the action items with their owners.",
     """Weekly product meeting, 14 March. Present: Priya (product), Jonas (engineering), Lea (design), Marco
(support), Fatima (marketing).

Priya opened with the release schedule. Version 4.2 was planned for 28 March, but two features are late: the
offline mode for the mobile app and the new export to spreadsheet. Jonas said the offline mode needs at least
two more weeks because syncing conflicts are harder than expected; his team found cases where edits made on two
devices overwrite each other. He proposed shipping 4.2 on time without offline mode and releasing it in 4.3 at
the end of April. The group agreed.

Lea showed the redesigned settings page. Testers in last week's study found the new layout faster, but three of
eight could not find the notification options, which are now under "Account". Lea will move them back to a
top-level section and run a short follow-up test with five users.

Marco reported that support tickets rose 18% in February, mostly from customers confused by the new pricing
page. The most common question is whether the annual plan can be paid monthly. Fatima said the answer is no,
but the page does not say so clearly. She will rewrite the pricing FAQ by Friday, and Marco will send her the
twenty most common ticket phrasings.

Finally, Fatima asked for a short video showing the spreadsheet export for the launch announcement. Since the
feature is late, the video will wait for 4.3. Jonas raised the question of hiring a second mobile developer;
Priya will discuss the budget with finance and report next week.

Next meeting: 21 March, same time.""", 320),
    ("Write a short summary of this incident report for executives: what happened, the impact, and what is "
     "being done.",
     """Incident report: payment processing outage, 2 June.

Summary of events. At 14:07 UTC, the payment service began returning errors for about 35% of card payments. The
on-call engineer was paged at 14:11 by an alert on the error rate. Initial investigation pointed to the database,
whose connection pool was exhausted. At 14:32 the team identified the trigger: a configuration change deployed at
13:58 had lowered the connection timeout for an external fraud-check provider from 10 seconds to 1 second. The
provider was responding slowly that afternoon, so requests were retried several times, and each retry held a
database connection while it waited. The change was rolled back at 14:41, and error rates returned to normal by
14:49.

Impact. Over 42 minutes, about 9,800 payment attempts failed. Most customers retried successfully; about 1,100
did not complete a purchase within the next hour. Estimated lost revenue is between $60,000 and $85,000. No card
data was exposed and no customer was charged twice.

Root cause. The configuration change was reviewed, but the reviewer did not know that the fraud-check call holds
a database connection. The retry logic also had no limit on total time, which multiplied the load.

Actions. First, the retry logic now has a total time budget of 5 seconds (done). Second, fraud checks will no
longer hold a database connection while waiting for the provider (in progress, due 20 June). Third, configuration
changes to payment services will need approval from a member of the payments team (done). Fourth, we are adding
a dashboard panel showing connection pool usage per caller (due 30 June).""", 256),
    ("Summarize this article in one paragraph of about 80 words.",
     """Why cities are planting tiny forests

Over the past decade, hundreds of so-called tiny forests have appeared in cities from Paris to Karachi. Each one
is small, often no bigger than a tennis court, but planted very densely: three or more young trees per square
metre, drawn from dozens of native species. The method was developed by the Japanese botanist Akira Miyawaki,
who argued that mixing many local species in rich soil lets a forest reach maturity in a few decades rather than
centuries.

Supporters say the forests cool the streets around them, absorb rainwater, and attract birds and insects that
had disappeared from the neighbourhood. Schools use them as outdoor classrooms, and volunteers who help with the
planting often keep visiting. Some city officials like them because they fit on awkward plots that are too small
for a park.

Scientists are more cautious. Studies of early sites in Europe found that the trees do grow quickly, but many
die in the first years as they compete for light, and the claims of faster growth than ordinary forests are
hard to check because few projects measure anything. The cooling effect is real but local, reaching only a few
metres beyond the edge. Critics also point out that a tiny forest needs watering and weeding for two or three
years, which some cities have underestimated.

Even so, most researchers agree that the forests do little harm and some good, especially where people have
little access to green space. The open question is whether the money would do more good spent on street trees or
on protecting older woodland nearby.""", 192),
    ("Summarize the key points of this policy for new employees as a short list.",
     """Remote work policy (effective 1 September)

Eligibility. All employees who have completed their three-month probation may work remotely up to three days a
week. Roles that require physical presence, such as laboratory and reception staff, are excluded; their managers
may agree other flexible arrangements.

Core hours. Remote employees must be reachable between 10:00 and 15:00 in their team's time zone, and must attend
the weekly team meeting in person unless their manager agrees otherwise.

Equipment. The company provides a laptop, a monitor and a headset. Employees may claim up to 300 euros once every
three years for a desk or chair. Company equipment must not be used by family members, and must be returned when
employment ends.

Security. Work must be done on company devices only. Public Wi-Fi may be used only with the company VPN switched
on. Confidential documents must not be printed at home. Lost or stolen devices must be reported to IT within 24
hours.

Working abroad. Employees may work from another country for up to 20 working days per year, provided they inform
HR at least two weeks in advance. Longer stays need approval from HR and the legal team because of tax and
insurance rules.

Review. Managers review remote arrangements every six months. If performance or availability suffers, a manager
may reduce the number of remote days after discussing it with the employee and HR.""", 256),
    ("Give me the gist of this story in three sentences.",
     """The lighthouse keeper's last winter

For thirty-one years Elias Brandt kept the light on Skarvholm, a rock so small that at high tide the spray
reached his kitchen window. When the letter came saying the light would be automated in spring, he read it twice,
folded it into a square, and put it under the clock.

That winter was the hardest anyone remembered. The supply boat missed three weeks in January, and Elias lived on
dried fish, oats and the last of the potatoes. He kept the logbook as he always had: wind, visibility, ships
passing. On the night of 9 February a fishing boat lost its engine in a storm north of the rock. Elias saw its
lights drifting towards the reef, and for four hours he signalled with the lamp by hand, guiding the crew to the
lee side of the island, where they anchored until morning.

The rescue made the newspapers, and for a week people talked about whether a machine could have done the same.
The engineers said the new light would be brighter and never sleep. Elias said nothing in public. In April he
packed two suitcases and the logbooks, which the museum in town had asked for, and left on the supply boat. He
did not look back until the rock was almost out of sight, and then he looked for a long time.

The fishermen he had guided that night still leave a bottle of aquavit on the landing stage every February. No
one has ever seen who drinks it.""", 160),
    ("Summarize this product review, then say whether the reviewer would recommend the product.",
     """I bought the TrailLite 2 tent for a two-week hiking trip in Scotland after my old tent finally gave up. It
weighs 1.4 kg with pegs, which is about half of what I was carrying before, and packs down to the size of a
water bottle. Setting it up takes about five minutes once you have done it twice; the first time took me twenty,
mostly because the instructions are printed inside the bag in tiny type.

The good: it stayed completely dry through two nights of heavy rain, and the vestibule is big enough for a pack
and boots. Ventilation is better than in most light tents I have used, and I had very little condensation except
on one still, cold night. The zips are smooth and the colours are easy to find in the dark.

The not so good: it needs trekking poles to stand, which is fine if you carry them but annoying otherwise. The
floor fabric is thin, and I would not pitch it on rough ground without the optional footprint, which costs
extra. Wind is its weakness. On an exposed ridge with strong gusts, the side panels flapped loudly all night and
I had to get up twice to re-tension the guy lines. Inside, there is room for one person and gear, or two people
who are very good friends.

Overall it is expensive for what you get, but the weight saving is real and it did everything I needed in bad
weather. For solo hikers who count every gram, I think it is worth it. If you camp in windy places or want
space, look elsewhere.""", 192),
    ("Summarize this explanation for a reader with no technical background.",
     """How a database index works

A database table is stored roughly in the order rows were added. To find all orders from one customer without
help, the database has to read every row and check the customer column, which is called a full table scan. For
a table with a few thousand rows this is fast enough, but for hundreds of millions of rows it can take minutes.

An index is a separate structure, kept up to date by the database, that stores the values of one or more columns
in sorted order together with a pointer to the row where each value appears. Most databases use a B-tree for
this: a shallow tree in which each node holds many sorted keys, so that even a table with a billion rows needs
only four or five steps from the root to the right leaf. Finding one customer's orders then means walking down
the tree and following the pointers, instead of reading the whole table.

Indexes are not free. Every insert, update or delete must also change each index on the table, so a table with
many indexes is slower to write. Indexes also take disk space and memory. And an index only helps queries that
can use its order: an index on (country, city) helps a search for a country, or for a country and a city, but
not a search for a city alone.

Choosing indexes is therefore a trade-off. A good rule is to index the columns used to look up or join rows in
the most frequent queries, to check with the database's query plan that the index is actually used, and to
remove indexes that no query needs.""", 192),
    ("Summarize this email thread in a few sentences and say what decision is still open.",
     """From: Hannah  To: Site committee  Subject: Summer fair

Hi all, the council confirmed we can use the park on Saturday 6 July from 10:00 to 18:00. They want a plan for
toilets and waste by 1 June. Last year we had 1,500 visitors, so I suggest six portable toilets. Thoughts?

From: Ben
Six sounds right. The hire company we used last year has raised prices by 20%, so I asked two others for quotes.
One can deliver on Friday afternoon, which would save us a morning. I'll have numbers by Wednesday.

From: Olga
On waste: the council offers recycling bins for free if we book them a month ahead. I'd also like to ban
single-use plastic cups this year and ask stalls to use the reusable cup scheme from the food festival. It costs
a one-euro deposit per cup, refunded when returned.

From: Hannah
Love the cup idea, but some stall holders will complain. Can we make it a recommendation this year and a rule
next year?

From: Olga
I'd rather make it a rule now. The festival did it last year with no real problems, and a recommendation means
half the stalls will ignore it. We can send stall holders the rules with their booking confirmation so nobody is
surprised.

From: Ben
Quotes are in: 95 euros per toilet from the cheaper company, delivered Friday. I've booked six provisionally.
Olga, can you book the recycling bins? We still need to agree on the cups before the stall letters go out on 15
May.""", 192),
]
