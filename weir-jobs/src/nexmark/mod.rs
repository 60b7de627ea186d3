//! Nexmark: the online-auction benchmark of Tucker et al. (NEXMark, 2002) as Apache Beam and
//! the Flink Nexmark suite generate it, with queries q0–q22 as
//! weir jobs and as plain sequential functions that the tests (and `weir nexmark --check`)
//! compare them with.
//!
//! The generator follows the standard parameters: out of every 50 events, 1 person, 3
//! auctions and 46 bids; 1,000 active people and 100 auctions in flight; half the bids go to
//! hot auctions (every 100th id) and a quarter to hot bidders, a quarter of the auctions to hot
//! sellers; prices are log-uniform from $1 to $1,000,000 (in cents); event time advances 100 µs
//! per event (a first event rate of 10,000/s). Event `n` depends only on `n`, so a run can be
//! replayed and split over subtasks. The text fields of the standard generator are there
//! (names, e-mails, credit cards, cities and states; item names and descriptions; channels,
//! URLs; padding), drawn from the event's number when a query reads them (methods of
//! [`Person`], [`Auction`] and [`Bid`]): short ones inline in a [`Word`](weir::Word), channel URLs made
//! once per process and shared, as the standard generator caches them.
//!
//! May touch: `error`, `operator`, `persist`, `pipeline`, `prng`, `record`, `runtime`,
//! `sink` (to read back what q10 wrote), `source`, `state`.
//!
//! The parts: `events` (the generator), `functions` (the keyed functions queries use),
//! `reference` (the sequential implementations); this file is the queries as jobs.

mod events;
mod functions;
mod reference;

use weir::operator::window::{Window, WindowBounds};
use weir::pipeline::Job;
use weir::record::hash_key;

pub use events::*;
use functions::*;
pub use reference::*;

/// q10's partition of a bid: `dt=YYYY-MM-DD/hm=HH:MM` of its event time (the epoch being the
/// stream's start).
fn q10_partition(b: &Bid, out: &mut String) {
    use std::fmt::Write;
    let (minutes, days) = (b.date_time / 60_000, b.date_time / 86_400_000);
    let (y, m, d) = weir::record::civil_date(days);
    write!(out, "dt={y:04}-{m:02}-{d:02}/hm={:02}:{:02}", minutes / 60 % 24, minutes % 60).expect("to a String");
}

/// q10's line for a bid: auction, bidder, price, event time (ms), padding.
fn q10_line(b: &Bid, out: &mut Vec<u8>) {
    use std::io::Write;
    write!(out, "{},{},{},{},", b.auction, b.bidder, b.price, b.date_time).expect("to a Vec");
    b.extra().write_to(out);
    out.push(b'\n');
}

/// q10 as the suite runs it: every bid written under `dir`, partitioned by day and minute
/// (`<dir>/dt=…/hm=…/part-<subtask>`, one line per bid: auction, bidder, price, time, padding),
/// exactly once with checkpoints ([`weir::pipeline::Stream::write_files_partitioned`]).
pub fn write_q10(job: &Job, events: Option<u64>, rate: Option<f64>, dir: &std::path::Path) {
    job.generator(generator(events, rate))
        .named("nexmark")
        .flat_map(|e: Event, out| {
            if let Event::Bid(b) = e {
                out.emit(b);
            }
        })
        .write_files_partitioned(dir, q10_partition, q10_line);
}

/// What q10 writes for the first `events` events, as [`read_q10`] reads it back.
pub fn q10_reference(events: u64) -> std::collections::BTreeMap<String, Vec<String>> {
    let mut files: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    for e in (0..events).map(event) {
        let Some(b) = bid_of(&e) else { continue };
        let (mut partition, mut line) = (String::new(), Vec::new());
        q10_partition(b, &mut partition);
        q10_line(b, &mut line);
        line.pop();
        files.entry(partition).or_default().push(String::from_utf8(line).expect("ASCII"));
    }
    files.values_mut().for_each(|lines| lines.sort_unstable());
    files
}

/// The lines q10 wrote under `dir`, per partition (every subtask's file together, sorted).
pub fn read_q10(dir: &std::path::Path) -> weir::error::Result<std::collections::BTreeMap<String, Vec<String>>> {
    let mut files: std::collections::BTreeMap<String, Vec<String>> = std::collections::BTreeMap::new();
    for (partition, path) in weir::sink::partition_files(dir)? {
        if path.file_name().is_some_and(|n| n.to_string_lossy().starts_with("part-")) {
            let text = std::fs::read_to_string(&path)
                .map_err(|e| weir::error::Error::io("cannot read output file", &path, e))?;
            files.entry(partition).or_default().extend(text.lines().map(str::to_owned));
        }
    }
    files.values_mut().for_each(|lines| lines.sort_unstable());
    Ok(files)
}

/// The queries, numbered as in the Nexmark suite.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Query {
    /// Pass-through: every event to the sink.
    Q0,
    /// Currency conversion: every bid's price in euros (× 0.908).
    Q1,
    /// Selection: bids on auctions whose id is a multiple of 123.
    Q2,
    /// Local item suggestion: sellers in Oregon, Idaho or California and their auctions in
    /// category 10 (an unwindowed join of people and auctions).
    Q3,
    /// Average price per category: each auction's closing price (its highest bid while it was
    /// open), averaged per category.
    Q4,
    /// Hot items: per 10 s window sliding every 2 s, the auction(s) with the most bids.
    Q5,
    /// Average selling price by seller: the mean closing price of each seller's last 10
    /// auctions.
    Q6,
    /// Highest bid: per 10 s tumbling window, the highest price.
    Q7,
    /// New users: people who created an auction in the same 10 s tumbling window.
    Q8,
    /// Winning bids: each auction with its winning bid.
    Q9,
    /// Log to a file system: every bid, partitioned into folders by day and minute
    /// (`dt=YYYY-MM-DD/hm=HH:MM`; see [`write_q10`]). As rows: (auction, bidder, price).
    Q10,
    /// User sessions: bids per bidder session (a gap of 10 s ends one).
    Q11,
    /// Processing-time windows: bids per bidder per 10 s of processing time.
    Q12,
    /// Bounded side-input join: each bid with its auction's entry in a fixed table.
    Q13,
    /// Calculation: bids between 1,000,000 and 50,000,000 (euro cents), with the time of day
    /// and the number of zeros in their padding.
    Q14,
    /// Bidding statistics per day: bids, bidders and auctions, in all and by price range.
    Q15,
    /// Channel statistics per channel and day.
    Q16,
    /// Auction statistics per auction and day: bids, lowest, highest, mean and total price.
    Q17,
    /// Each bidder's last bid on each auction.
    Q18,
    /// Each auction's ten highest bids.
    Q19,
    /// Bids expanded with their auction, for auctions in category 10 (an unwindowed join).
    Q20,
    /// The channel id of each bid: from the channel's name, or the URL's `channel_id`.
    Q21,
    /// The first three directories of each bid's URL.
    Q22,
}

impl Query {
    /// Every query.
    pub const ALL: [Query; 23] = [
        Query::Q0,
        Query::Q1,
        Query::Q2,
        Query::Q3,
        Query::Q4,
        Query::Q5,
        Query::Q6,
        Query::Q7,
        Query::Q8,
        Query::Q9,
        Query::Q10,
        Query::Q11,
        Query::Q12,
        Query::Q13,
        Query::Q14,
        Query::Q15,
        Query::Q16,
        Query::Q17,
        Query::Q18,
        Query::Q19,
        Query::Q20,
        Query::Q21,
        Query::Q22,
    ];

    fn number(self) -> u32 {
        match self {
            Query::Q0 => 0,
            Query::Q1 => 1,
            Query::Q2 => 2,
            Query::Q3 => 3,
            Query::Q4 => 4,
            Query::Q5 => 5,
            Query::Q6 => 6,
            Query::Q7 => 7,
            Query::Q8 => 8,
            Query::Q9 => 9,
            Query::Q10 => 10,
            Query::Q11 => 11,
            Query::Q12 => 12,
            Query::Q13 => 13,
            Query::Q14 => 14,
            Query::Q15 => 15,
            Query::Q16 => 16,
            Query::Q17 => 17,
            Query::Q18 => 18,
            Query::Q19 => 19,
            Query::Q20 => 20,
            Query::Q21 => 21,
            Query::Q22 => 22,
        }
    }

    /// How a job's rows reduce to the reference's (see [`final_rows`]).
    fn final_form(self) -> FinalForm {
        match self {
            Query::Q5 | Query::Q7 => FinalForm::BestPerWindow,
            // Running results: the last row per key is the final one.
            Query::Q4 | Query::Q6 | Query::Q15 => FinalForm::LastPerKey(1),
            Query::Q16 | Query::Q17 | Query::Q18 => FinalForm::LastPerKey(2),
            Query::Q12 => FinalForm::SumPerKey,
            _ => FinalForm::All,
        }
    }
}

/// How a query's output rows compare with the reference's.
enum FinalForm {
    /// Every row.
    All,
    /// Per window, the best row (q5: most bids; q7: highest price).
    BestPerWindow,
    /// The last row of each key (the first 1 or 2 columns): running aggregates.
    LastPerKey(usize),
    /// Per key (the first column), the sum of the second (counts over processing-time windows,
    /// which depend on timing; their sum does not).
    SumPerKey,
}

impl std::str::FromStr for Query {
    type Err = String;
    fn from_str(s: &str) -> std::result::Result<Self, String> {
        weir::error::one_of(&Query::ALL, s, "a query here")
    }
}

impl std::fmt::Display for Query {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "q{}", self.number())
    }
}

/// A query's results as comparable rows (`(a, b, c)`: see each query).
pub type Row = (u64, u64, u64);

#[doc(hidden)] // for the tests (tests/jobs.rs)
pub fn bid_of(e: &Event) -> Option<&Bid> {
    match e {
        Event::Bid(b) => Some(b),
        _ => None,
    }
}

type Stream<T> = weir::pipeline::Stream<T>;

/// The bids' numbers, with event-time watermarks. Events come in time order, ten to a
/// millisecond: a watermark trails the newest time by 1 ms, so a bid in the same millisecond as
/// the last one is never late.
fn bid_prices(events: Stream<Event>) -> Stream<BidPrice> {
    events
        .flat_map(|e: Event, out| {
            if let Event::Bid(b) = &e {
                out.emit(b.numbers());
            }
        })
        .with_watermarks(|b: &BidPrice| b.date_time, 1)
}

/// The auctions, with watermarks.
fn auctions(events: Stream<Event>) -> Stream<Auction> {
    events
        .flat_map(|e: Event, out| {
            if let Event::Auction(a) = e {
                out.emit(*a);
            }
        })
        .with_watermarks(|a: &Auction| a.date_time, 1)
}

fn window_start(t: u64, size: u64) -> u64 {
    t - t % size
}

/// Milliseconds in a day (q15–q17 group by day).
const DAY_MS: u64 = 86_400_000;

/// One closed auction (q4, q6, q9): its winning bid.
#[derive(Clone, Copy, Debug, PartialEq, Eq, weir::Persist)]
pub struct Closed {
    /// Auction id.
    pub auction: u64,
    /// Its category.
    pub category: u64,
    /// Its seller.
    pub seller: u64,
    /// When it closed.
    pub expires: u64,
    /// The winning price.
    pub price: u64,
    /// The winner.
    pub bidder: u64,
}

/// The winning bid of a bid: highest price, then earliest, then the smallest bidder.
fn beats(a: &BidPrice, b: &BidPrice) -> bool {
    (a.price, u64::MAX - a.date_time, u64::MAX - a.bidder) > (b.price, u64::MAX - b.date_time, u64::MAX - b.bidder)
}

/// Builds query `q` over `events` events (at `rate` events/s if given) on `job`; its results
/// go to the returned stream as rows: q0 (event time, kind, 0); q1 (auction, bidder, euro
/// cents); q2 (auction, price, 0); q3 (seller, auction, person digest); q4 (category, closed
/// auctions, mean price); q5 (window start, auction, bids) for every update of a window's
/// leader; q6 (seller, closed auctions, mean of the last ten); q7 (window start, price,
/// bidder) for every new highest bid; q8 (person, auction, window start); q9 (auction, price,
/// bidder); q10 (auction, bidder, price: what it writes, without the files, see [`write_q10`]);
/// q11 (bidder, session start, bids); q12 (bidder, bids, window start); q13
/// (auction, price, side value); q14 (auction, euro cents, time of day × 2^32 + zeros);
/// q15 (day, bids, digest); q16 (channel, day, digest); q17 (auction, day, digest); q18
/// (bidder, auction, price); q19 (auction, price, bidder); q20 (auction, price, item);
/// q21 (auction, price, channel id); q22 (auction, price, directories).
pub fn build(job: &Job, q: Query, events: Option<u64>, rate: Option<f64>) -> Stream<Row> {
    let source = job.generator(generator(events, rate)).named("nexmark");
    let name = q.to_string();
    let bids_map = |f: fn(&Bid) -> Option<Row>| {
        source.clone().flat_map(move |e: Event, out| {
            if let Some(r) = bid_of(&e).and_then(f) {
                out.emit(r);
            }
        })
    };
    let rows = match q {
        Query::Q0 => source.map(|e: Event| {
            let kind = match e {
                Event::Person(_) => 0,
                Event::Auction(_) => 1,
                Event::Bid(_) => 2,
            };
            (e.date_time(), kind, 0)
        }),
        Query::Q1 => bids_map(|b| Some((b.auction, b.bidder, b.price * 908 / 1000))),
        Query::Q2 => bids_map(|b| (b.auction % 123 == 0).then_some((b.auction, b.price, 0))),
        Query::Q3 => local_item_suggestion(source),
        Query::Q4 => average_price_by_category(source),
        Query::Q5 => hot_items(source),
        Query::Q6 => closed(source).key_by(|c: &Closed| c.seller).keyed_process(SellerAverage),
        Query::Q7 => highest_bid(source),
        Query::Q8 => new_people_selling(job, source, events, rate),
        Query::Q9 => closed(source).map(|c: Closed| (c.auction, c.price, c.bidder)),
        Query::Q10 => bids_map(|b| Some((b.auction, b.bidder, b.price))),
        Query::Q11 => bid_prices(source)
            .key_by(|b: &BidPrice| b.bidder)
            .session_window(WINDOW_MS, |b: &BidPrice| b.date_time)
            .count()
            .map(|(bidder, w, n)| (bidder, w.start, n)),
        Query::Q12 => bid_prices(source)
            .key_by(|b: &BidPrice| b.bidder)
            .processing_time_window(Window::tumbling(WINDOW_MS))
            .count()
            .map(|(bidder, w, n)| (bidder, n, w.start)),
        Query::Q13 => bids_map(|b| Some((b.auction, b.price, side_input(b.auction)))),
        Query::Q14 => bids_map(|b| {
            let euros = b.price * 908 / 1000;
            (1_000_000 < euros && euros < 50_000_000).then(|| {
                let zeros = b.extra().with_str(|s| s.bytes().filter(|&c| c == b'0').count() as u64);
                (b.auction, euros, time_of_day(b.date_time) << 32 | zeros)
            })
        }),
        Query::Q15 => bid_prices(source).key_by(|b: &BidPrice| b.date_time / DAY_MS).aggregate(
            BidStats::default,
            |s: &mut BidStats, b: BidPrice| s.add(&b),
            |&day, s: &BidStats| (day, s.bids, s.digest()),
        ),
        Query::Q16 => channel_statistics(source),
        Query::Q17 => bid_prices(source).key_by(|b: &BidPrice| (b.auction, b.date_time / DAY_MS)).aggregate(
            BidStats::default,
            |s: &mut BidStats, b: BidPrice| s.add(&b),
            |&(auction, day), s: &BidStats| (auction, day, hash_key(&(s.bids, s.min, s.max, s.sum / s.bids, s.sum))),
        ),
        Query::Q18 => bid_prices(source)
            .key_by(|b: &BidPrice| (b.bidder, b.auction))
            // The last bid: latest time, then (same millisecond) the highest price.
            .reduce(|a, b| if (b.date_time, b.price) >= (a.date_time, a.price) { *b } else { *a })
            .map(|b: BidPrice| (b.bidder, b.auction, b.price)),
        Query::Q19 => bid_prices(source).key_by(|b: &BidPrice| b.auction).keyed_process(TopBids),
        Query::Q20 => {
            let auctions = auctions(source.clone()).filter(|a: &Auction| a.category == 10).key_by(|a: &Auction| a.id);
            let bids = bid_prices(source).key_by(|b: &BidPrice| b.auction);
            auctions.connect(bids).process(ExpandBids)
        }
        Query::Q21 => bids_map(|b| Some((b.auction, b.price, channel_id(b)))),
        Query::Q22 => bids_map(|b| Some((b.auction, b.price, url_dirs(b)))),
    };
    rows.named(&name)
}

/// Q4: the average closing price per category.
fn average_price_by_category(source: Stream<Event>) -> Stream<Row> {
    closed(source).key_by(|c: &Closed| c.category).aggregate(
        || (0u64, 0u64),
        |(n, sum): &mut (u64, u64), c: Closed| {
            *n += 1;
            *sum += c.price;
        },
        |&category, &(n, sum)| (category, n, sum / n),
    )
}

/// Q5: per sliding window, the auction with the most bids.
fn hot_items(source: Stream<Event>) -> Stream<Row> {
    bid_prices(source)
        .key_by(|b: &BidPrice| b.auction)
        .window(Window::sliding(WINDOW_MS, SLIDE_MS), |b: &BidPrice| b.date_time)
        .count()
        .named("q5-count")
        .key_by(|r: &(u64, WindowBounds, u64)| r.1.start)
        // The leader so far: most bids, then the smaller auction id.
        .reduce(|a, b| if (b.2, u64::MAX - b.0) > (a.2, u64::MAX - a.0) { *b } else { *a })
        .named("q5-max")
        .map(|(auction, w, count)| (w.start, auction, count))
}

/// Q3: people in Oregon, Idaho or California joined with the auctions they sell in category 10.
fn local_item_suggestion(source: Stream<Event>) -> Stream<Row> {
    let people = source
        .clone()
        .flat_map(|e: Event, out| {
            if let Event::Person(p) = e {
                if p.state().with_str(|s| matches!(s, "OR" | "ID" | "CA")) {
                    out.emit(*p);
                }
            }
        })
        .key_by(|p: &Person| p.id);
    let auctions = source
        .flat_map(|e: Event, out| {
            if let Event::Auction(a) = e {
                if a.category == 10 {
                    out.emit(*a);
                }
            }
        })
        .key_by(|a: &Auction| a.seller);
    people.connect(auctions).process(LocalItems)
}

/// Q8: people joined with the auctions they opened in the window they registered in (a second generator reads the auctions).
fn new_people_selling(job: &Job, source: Stream<Event>, events: Option<u64>, rate: Option<f64>) -> Stream<Row> {
    // The join reads ids and times only: people and auctions are projected onto them
    // before the key-by (their strings never cross a ring).
    let people = source
        .flat_map(|e: Event, out| {
            if let Event::Person(p) = e {
                out.emit((p.id, p.date_time));
            }
        })
        .with_watermarks(|p: &(u64, u64)| p.1, 1);
    let auctions = job
        .generator(generator(events, rate))
        .named("nexmark-auctions")
        .flat_map(|e: Event, out| {
            if let Event::Auction(a) = e {
                out.emit((a.id, a.seller, a.date_time));
            }
        })
        .with_watermarks(|a: &(u64, u64, u64)| a.2, 1);
    people.window_join(
        auctions,
        |p: &(u64, u64)| p.0,
        |a: &(u64, u64, u64)| a.1,
        |p: &(u64, u64)| p.1,
        |a: &(u64, u64, u64)| a.2,
        Window::tumbling(WINDOW_MS),
        |&id, p: &(u64, u64), a: &(u64, u64, u64)| (id, a.0, window_start(p.1, WINDOW_MS)),
    )
}

/// Q7: per tumbling window, the highest bid (of each auction, then of all).
fn highest_bid(source: Stream<Event>) -> Stream<Row> {
    bid_prices(source)
        .key_by(|b: &BidPrice| b.auction)
        .window(Window::tumbling(WINDOW_MS), |b: &BidPrice| b.date_time)
        .aggregate(
            || (0u64, 0u64),
            |best: &mut (u64, u64), b: BidPrice| {
                if (b.price, u64::MAX - b.bidder) > (best.0, u64::MAX - best.1) {
                    *best = (b.price, b.bidder);
                }
            },
            |_, w, best| (w.start, best.0, best.1),
        )
        .named("q7-per-auction")
        .key_by(|r: &Row| r.0)
        .reduce(|a, b| if (b.1, u64::MAX - b.2) > (a.1, u64::MAX - a.2) { *b } else { *a })
        .named("q7-max")
}

/// Q16: bidding statistics per channel and day.
fn channel_statistics(source: Stream<Event>) -> Stream<Row> {
    source
        .flat_map(|e: Event, out| {
            if let Event::Bid(b) = e {
                out.emit((hash_key(&b.channel()), b.numbers()));
            }
        })
        .key_by(|(channel, b): &(u64, BidPrice)| (*channel, b.date_time / DAY_MS))
        .aggregate(
            BidStats::default,
            |s: &mut BidStats, (_, b): (u64, BidPrice)| s.add(&b),
            |&(channel, day), s: &BidStats| (channel, day, hash_key(&(s.bids, s.digest()))),
        )
}
