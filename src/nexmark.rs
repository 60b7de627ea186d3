//! Nexmark: the online-auction benchmark of Tucker et al. (NEXMark, 2002) as Apache Beam and
//! the Flink Nexmark suite generate it, with queries q0, q1, q2, q5, q7 and q8 as weir jobs and
//! as plain sequential functions that the tests (and `weir nexmark --check`) compare them with.
//!
//! The generator follows the standard parameters: out of every 50 events, 1 person, 3
//! auctions and 46 bids; 1,000 active people and 100 auctions in flight; half the bids go to
//! hot auctions (every 100th id) and a quarter to hot bidders, a quarter of the auctions to hot
//! sellers; prices are log-uniform from $1 to $1,000,000 (in cents); event time advances 100 µs
//! per event (a first event rate of 10,000/s). Event `n` depends only on `n`, so a run can be
//! replayed and split over subtasks. Text fields other than a person's name (needed by q8) are
//! left out: the queries here do not read them.
//!
//! May touch: `error`, `operator::window`, `persist`, `pipeline`, `prng`, `record`, `runtime`,
//! `source`.

use std::collections::HashMap;

use crate::operator::window::{Window, WindowBounds};
use crate::persist::{take, Persist};
use crate::pipeline::Job;
use crate::prng::mix;
use crate::source::Generator;

/// Event time between two events, in microseconds (10,000 events/s).
pub const INTER_EVENT_US: u64 = 100;
const PERSON_PROPORTION: u64 = 1;
const AUCTION_PROPORTION: u64 = 3;
const TOTAL_PROPORTION: u64 = 50;
const ACTIVE_PEOPLE: u64 = 1_000;
const IN_FLIGHT_AUCTIONS: u64 = 100;
const HOT_AUCTION_RATIO: u64 = 2;
const HOT_BIDDER_RATIO: u64 = 4;
const HOT_SELLER_RATIO: u64 = 4;
/// Hot ids are multiples of this.
const HOT_ID_STEP: u64 = 100;
const FIRST_PERSON_ID: u64 = 1_000;
const FIRST_AUCTION_ID: u64 = 1_000;
const FIRST_CATEGORY_ID: u64 = 10;
/// q5 and q7/q8 windows: 10 s, sliding every 2 s for q5.
pub const WINDOW_MS: u64 = 10_000;
/// q5's slide.
pub const SLIDE_MS: u64 = 2_000;

const FIRST_NAMES: [&str; 8] = ["Peter", "Paul", "Luke", "John", "Saul", "Vicky", "Kate", "Julie"];
const LAST_NAMES: [&str; 8] = ["Shultz", "Abrams", "Spencer", "White", "Bartels", "Walton", "Smith", "Jones"];

/// A new user.
#[derive(Clone, Debug, PartialEq, Eq, crate::Persist)]
pub struct Person {
    /// Person id.
    pub id: u64,
    /// Full name.
    pub name: String,
    /// Event time, ms.
    pub date_time: u64,
}

/// A new auction.
#[derive(Clone, Copy, Debug, PartialEq, Eq, crate::Persist)]
pub struct Auction {
    /// Auction id.
    pub id: u64,
    /// The seller's person id.
    pub seller: u64,
    /// Category id.
    pub category: u64,
    /// Opening price, cents.
    pub initial_bid: u64,
    /// Reserve price, cents.
    pub reserve: u64,
    /// Event time, ms.
    pub date_time: u64,
    /// When the auction closes, ms.
    pub expires: u64,
}

/// A bid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, crate::Persist)]
pub struct Bid {
    /// Auction id.
    pub auction: u64,
    /// The bidder's person id.
    pub bidder: u64,
    /// Price, cents.
    pub price: u64,
    /// Event time, ms.
    pub date_time: u64,
}

/// One Nexmark event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Event {
    /// A new user.
    Person(Person),
    /// A new auction.
    Auction(Auction),
    /// A bid.
    Bid(Bid),
}

impl Persist for Event {
    fn persist(&self, out: &mut Vec<u8>) {
        match self {
            Event::Person(p) => {
                out.push(0);
                p.persist(out)
            }
            Event::Auction(a) => {
                out.push(1);
                a.persist(out)
            }
            Event::Bid(b) => {
                out.push(2);
                b.persist(out)
            }
        }
    }
    fn restore(input: &mut &[u8]) -> crate::Result<Self> {
        Ok(match take(input, 1)?[0] {
            0 => Event::Person(Person::restore(input)?),
            1 => Event::Auction(Auction::restore(input)?),
            2 => Event::Bid(Bid::restore(input)?),
            t => return Err(crate::Error::Corrupt(format!("unknown Nexmark event tag {t}"))),
        })
    }
}

impl Event {
    /// Event time, ms.
    pub fn date_time(&self) -> u64 {
        match self {
            Event::Person(p) => p.date_time,
            Event::Auction(a) => a.date_time,
            Event::Bid(b) => b.date_time,
        }
    }
}

/// Random numbers for event `n`: the `k`-th draw.
fn draw(n: u64, k: u64) -> u64 {
    mix(n.wrapping_mul(8).wrapping_add(k))
}

/// People that exist at event `n` of an epoch after its person (every auction and bid):
/// one per epoch so far, this one included.
fn people_before(n: u64) -> u64 {
    (n / TOTAL_PROPORTION + 1) * PERSON_PROPORTION
}

/// Auctions that exist at a bid `n` (bids come after the epoch's auctions).
fn auctions_before(n: u64) -> u64 {
    (n / TOTAL_PROPORTION + 1) * AUCTION_PROPORTION
}

/// A recent id among `count` created so far: hot (a multiple of 100) one time in `ratio`.
fn pick(count: u64, recent: u64, ratio: u64, r: u64) -> u64 {
    let last = count - 1;
    if r.is_multiple_of(ratio) {
        // Hot: the newest multiple of the step.
        last / HOT_ID_STEP * HOT_ID_STEP
    } else {
        last - (r >> 8) % recent.min(count)
    }
}

/// Log-uniform price from $1 to $1,000,000, in cents.
fn price(r: u64) -> u64 {
    let unit = (r >> 11) as f64 / (1u64 << 53) as f64;
    (10f64.powf(unit * 6.0) * 100.0).round() as u64
}

/// Event number `n`.
pub fn event(n: u64) -> Event {
    let date_time = n * INTER_EVENT_US / 1_000;
    let offset = n % TOTAL_PROPORTION;
    if offset < PERSON_PROPORTION {
        let r = draw(n, 0);
        let name = format!("{} {}", FIRST_NAMES[(r % 8) as usize], LAST_NAMES[((r >> 8) % 8) as usize]);
        Event::Person(Person { id: FIRST_PERSON_ID + n / TOTAL_PROPORTION, name, date_time })
    } else if offset < PERSON_PROPORTION + AUCTION_PROPORTION {
        let id = FIRST_AUCTION_ID + n / TOTAL_PROPORTION * AUCTION_PROPORTION + (offset - PERSON_PROPORTION);
        let seller = FIRST_PERSON_ID + pick(people_before(n), ACTIVE_PEOPLE, HOT_SELLER_RATIO, draw(n, 1));
        let initial_bid = price(draw(n, 2));
        Event::Auction(Auction {
            id,
            seller,
            category: FIRST_CATEGORY_ID + draw(n, 3) % 5,
            initial_bid,
            reserve: initial_bid + price(draw(n, 4)),
            date_time,
            expires: date_time + 1 + draw(n, 5) % 20_000,
        })
    } else {
        Event::Bid(Bid {
            auction: FIRST_AUCTION_ID + pick(auctions_before(n), IN_FLIGHT_AUCTIONS, HOT_AUCTION_RATIO, draw(n, 6)),
            bidder: FIRST_PERSON_ID + pick(people_before(n), ACTIVE_PEOPLE, HOT_BIDDER_RATIO, draw(n, 7)),
            price: price(draw(n, 8)),
            date_time,
        })
    }
}

/// The queries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    /// Pass-through: every event to the sink.
    Q0,
    /// Currency conversion: every bid's price in euros (× 0.908).
    Q1,
    /// Selection: bids on auctions whose id is a multiple of 123.
    Q2,
    /// Hot items: per 10 s window sliding every 2 s, the auction(s) with the most bids.
    Q5,
    /// Highest bid: per 10 s tumbling window, the highest price.
    Q7,
    /// New users: people who created an auction in the same 10 s tumbling window.
    Q8,
}

impl Query {
    /// Every query.
    pub const ALL: [Query; 6] = [Query::Q0, Query::Q1, Query::Q2, Query::Q5, Query::Q7, Query::Q8];
}

impl std::str::FromStr for Query {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        crate::error::one_of(&Query::ALL, s, "a query here")
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let n = match self {
            Query::Q0 => 0,
            Query::Q1 => 1,
            Query::Q2 => 2,
            Query::Q5 => 5,
            Query::Q7 => 7,
            Query::Q8 => 8,
        };
        write!(f, "q{n}")
    }
}

/// A query's results as comparable rows (`(a, b, c)`: see each query).
pub type Row = (u64, u64, u64);

fn bid_of(e: &Event) -> Option<Bid> {
    match e {
        Event::Bid(b) => Some(*b),
        _ => None,
    }
}

/// The bids of an event stream, with event-time watermarks (events come in time order).
fn bids(events: crate::pipeline::Stream<Event>) -> crate::pipeline::Stream<Bid> {
    events
        .flat_map(|e: Event, out| {
            if let Some(b) = bid_of(&e) {
                out.emit(b);
            }
        })
        .with_watermarks(|b: &Bid| b.date_time, 0)
}

fn window_start(t: u64, size: u64) -> u64 {
    t - t % size
}

/// Builds query `q` over `events` events (at `rate` events/s if given) on `job`; its results
/// go to `sink` as rows. The rows: q0 (event time, kind, 0); q1 (auction, bidder, euro
/// cents); q2 (auction, price, 0); q5 (window start, auction, bids) for every update of a
/// window's leader; q7 (window start, price, bidder) for every new highest bid; q8 (person,
/// auction, window start).
pub fn build(job: &Job, q: Query, events: Option<u64>, rate: Option<f64>) -> crate::pipeline::Stream<Row> {
    let generator = || {
        let mut g = Generator::new(|n, _| event(n));
        if let Some(n) = events {
            g = g.count(n);
        }
        if let Some(r) = rate {
            g = g.rate(r);
        }
        g
    };
    let source = job.generator(generator()).named("nexmark");
    match q {
        Query::Q0 => source.map(|e: Event| {
            let kind = match e {
                Event::Person(_) => 0,
                Event::Auction(_) => 1,
                Event::Bid(_) => 2,
            };
            (e.date_time(), kind, 0)
        }),
        Query::Q1 => source
            .flat_map(|e: Event, out| {
                if let Some(b) = bid_of(&e) {
                    out.emit((b.auction, b.bidder, b.price * 908 / 1000));
                }
            })
            .named("q1"),
        Query::Q2 => source
            .flat_map(|e: Event, out| {
                if let Some(b) = bid_of(&e).filter(|b| b.auction % 123 == 0) {
                    out.emit((b.auction, b.price, 0));
                }
            })
            .named("q2"),
        Query::Q5 => bids(source)
            .key_by(|b: &Bid| b.auction)
            .window(Window::sliding(WINDOW_MS, SLIDE_MS), |b: &Bid| b.date_time)
            .count()
            .named("q5-count")
            .key_by(|r: &(u64, WindowBounds, u64)| r.1.start)
            // The leader so far: most bids, then the smaller auction id.
            .reduce(|a, b| if (b.2, u64::MAX - b.0) > (a.2, u64::MAX - a.0) { *b } else { *a })
            .named("q5-max")
            .map(|(auction, w, count)| (w.start, auction, count)),
        Query::Q7 => bids(source)
            .key_by(|b: &Bid| b.auction)
            .window(Window::tumbling(WINDOW_MS), |b: &Bid| b.date_time)
            .aggregate(
                || (0u64, 0u64),
                |best: &mut (u64, u64), b: Bid| {
                    if (b.price, u64::MAX - b.bidder) > (best.0, u64::MAX - best.1) {
                        *best = (b.price, b.bidder);
                    }
                },
                |_, w, best| (w.start, best.0, best.1),
            )
            .named("q7-per-auction")
            .key_by(|r: &Row| r.0)
            .reduce(|a, b| if (b.1, u64::MAX - b.2) > (a.1, u64::MAX - a.2) { *b } else { *a })
            .named("q7-max"),
        Query::Q8 => {
            let people = source
                .flat_map(|e: Event, out| {
                    if let Event::Person(p) = e {
                        out.emit(p);
                    }
                })
                .with_watermarks(|p: &Person| p.date_time, 0);
            let auctions = job
                .generator(generator())
                .named("nexmark-auctions")
                .flat_map(|e: Event, out| {
                    if let Event::Auction(a) = e {
                        out.emit(a);
                    }
                })
                .with_watermarks(|a: &Auction| a.date_time, 0);
            people
                .window_join(
                    auctions,
                    |p: &Person| p.id,
                    |a: &Auction| a.seller,
                    |p: &Person| p.date_time,
                    |a: &Auction| a.date_time,
                    Window::tumbling(WINDOW_MS),
                    |&id, p: &Person, a: &Auction| (id, a.id, window_start(p.date_time, WINDOW_MS)),
                )
                .named("q8")
        }
    }
}

/// What query `q` must produce over the first `events` events, computed sequentially, in the
/// form the checks compare: q0–q2 and q8 all rows; q5 per window the final leader (window,
/// auction, bids); q7 per window the final highest bid (window, price, bidder).
pub fn reference(q: Query, events: u64) -> Vec<Row> {
    let all: Vec<Event> = (0..events).map(event).collect();
    let bids = || all.iter().filter_map(bid_of);
    let mut rows: Vec<Row> = match q {
        Query::Q0 => all
            .iter()
            .map(|e| {
                let kind = match e {
                    Event::Person(_) => 0,
                    Event::Auction(_) => 1,
                    Event::Bid(_) => 2,
                };
                (e.date_time(), kind, 0)
            })
            .collect(),
        Query::Q1 => bids().map(|b| (b.auction, b.bidder, b.price * 908 / 1000)).collect(),
        Query::Q2 => bids().filter(|b| b.auction % 123 == 0).map(|b| (b.auction, b.price, 0)).collect(),
        Query::Q5 => {
            let mut counts: HashMap<(u64, u64), u64> = HashMap::new();
            for b in bids() {
                let mut start = window_start(b.date_time, SLIDE_MS);
                loop {
                    if start + WINDOW_MS > b.date_time {
                        *counts.entry((start, b.auction)).or_default() += 1;
                    }
                    if start < SLIDE_MS || start - SLIDE_MS + WINDOW_MS <= b.date_time {
                        break;
                    }
                    start -= SLIDE_MS;
                }
            }
            let mut best: HashMap<u64, (u64, u64)> = HashMap::new();
            for ((w, auction), c) in counts {
                let e = best.entry(w).or_insert((auction, c));
                if (c, u64::MAX - auction) > (e.1, u64::MAX - e.0) {
                    *e = (auction, c);
                }
            }
            best.into_iter().map(|(w, (a, c))| (w, a, c)).collect()
        }
        Query::Q7 => {
            let mut best: HashMap<u64, (u64, u64)> = HashMap::new();
            for b in bids() {
                let e = best.entry(window_start(b.date_time, WINDOW_MS)).or_insert((b.price, b.bidder));
                if (b.price, u64::MAX - b.bidder) > (e.0, u64::MAX - e.1) {
                    *e = (b.price, b.bidder);
                }
            }
            best.into_iter().map(|(w, (p, bidder))| (w, p, bidder)).collect()
        }
        Query::Q8 => {
            let mut people: HashMap<(u64, u64), u64> = HashMap::new();
            for e in &all {
                if let Event::Person(p) = e {
                    *people.entry((p.id, window_start(p.date_time, WINDOW_MS))).or_default() += 1;
                }
            }
            let mut rows = Vec::new();
            for e in &all {
                if let Event::Auction(a) = e {
                    let w = window_start(a.date_time, WINDOW_MS);
                    for _ in 0..people.get(&(a.seller, w)).copied().unwrap_or(0) {
                        rows.push((a.seller, a.id, w));
                    }
                }
            }
            rows
        }
    };
    rows.sort_unstable();
    rows
}

/// Reduces a job's output rows to the form [`reference`] gives: for q5 and q7 the last (best)
/// row per window, otherwise all rows; sorted.
pub fn final_rows(q: Query, mut rows: Vec<Row>) -> Vec<Row> {
    match q {
        Query::Q5 | Query::Q7 => {
            let mut best: HashMap<u64, Row> = HashMap::new();
            for r in rows {
                let e = best.entry(r.0).or_insert(r);
                let better = match q {
                    // Most bids, then the smaller auction.
                    Query::Q5 => (r.2, u64::MAX - r.1) > (e.2, u64::MAX - e.1),
                    // Highest price, then the smaller bidder.
                    _ => (r.1, u64::MAX - r.2) > (e.1, u64::MAX - e.2),
                };
                if better {
                    *e = r;
                }
            }
            let mut v: Vec<Row> = best.into_values().collect();
            v.sort_unstable();
            v
        }
        _ => {
            rows.sort_unstable();
            rows
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::runtime::RunConfig;

    #[test]
    fn the_generator_keeps_the_standard_proportions_and_hot_ids() {
        let n = 50_000;
        let events: Vec<Event> = (0..n).map(event).collect();
        let count = |f: fn(&Event) -> bool| events.iter().filter(|e| f(e)).count() as u64;
        assert_eq!(count(|e| matches!(e, Event::Person(_))), n / 50);
        assert_eq!(count(|e| matches!(e, Event::Auction(_))), n / 50 * 3);
        let bids: Vec<Bid> = events.iter().filter_map(bid_of).collect();
        let hot = bids.iter().filter(|b| (b.auction - FIRST_AUCTION_ID).is_multiple_of(HOT_ID_STEP)).count();
        assert!(hot * 2 > bids.len() * 9 / 20, "about half the bids go to hot auctions ({hot} of {})", bids.len());
        assert!(bids.iter().all(|b| (100..=100_000_000).contains(&b.price)));
        assert_eq!(event(12_345), event(12_345), "an event depends only on its number");
        // Bids refer to auctions and people that already exist.
        for (n, e) in events.iter().enumerate() {
            if let Event::Bid(b) = e {
                assert!(b.auction < FIRST_AUCTION_ID + auctions_before(n as u64));
                assert!(b.bidder < FIRST_PERSON_ID + people_before(n as u64));
            }
        }
    }

    /// Every query at parallelism 2 gives what the sequential implementation gives.
    #[test]
    fn every_query_matches_the_sequential_implementation() {
        let events = 60_000;
        for q in Query::ALL {
            let job = Job::new(format!("nexmark-{q}")).with_parallelism(2);
            let out = build(&job, q, Some(events), None).collect();
            job.execute(RunConfig::default().workers(2)).unwrap();
            let got = final_rows(q, out.lock().unwrap().clone());
            let expected = reference(q, events);
            assert!(!expected.is_empty(), "{q}");
            assert_eq!(got.len(), expected.len(), "{q}: row count");
            assert!(got == expected, "{q}: rows differ");
        }
    }
}
