//! Every query as a plain sequential function over the first events, and a job's rows
//! reduced to the form those give, so the tests and `weir nexmark --check` compare them.
//!
//! May touch: `weir` (records).

use std::collections::HashMap;

use weir::record::hash_key;

use super::*;

/// The closed auctions of the first `events` events, computed sequentially.
pub(super) fn reference_closed(all: &[Event]) -> Vec<Closed> {
    let mut best: HashMap<u64, BidPrice> = HashMap::new();
    let opened: HashMap<u64, &Auction> = all
        .iter()
        .filter_map(|e| match e {
            Event::Auction(a) => Some((a.id, &**a)),
            _ => None,
        })
        .collect();
    for b in all.iter().filter_map(bid_of).map(Bid::numbers) {
        if let Some(a) = opened.get(&b.auction) {
            if (a.date_time..=a.expires).contains(&b.date_time) && best.get(&b.auction).is_none_or(|x| beats(&b, x)) {
                best.insert(b.auction, b);
            }
        }
    }
    let mut out: Vec<Closed> = best
        .into_iter()
        .map(|(id, b)| {
            let a = opened[&id];
            Closed {
                auction: id,
                category: a.category,
                seller: a.seller,
                expires: a.expires,
                price: b.price,
                bidder: b.bidder,
            }
        })
        .collect();
    out.sort_unstable_by_key(|c| (c.expires, c.auction));
    out
}

/// What query `q` must produce over the first `events` events, computed sequentially, in the
/// form the checks compare ([`final_rows`] of a job's rows).
pub fn reference(q: Query, events: u64) -> Vec<Row> {
    let all: Vec<Event> = (0..events).map(event).collect();
    let bids = || all.iter().filter_map(bid_of);
    let prices = || bids().map(Bid::numbers);
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
        Query::Q3 => people_selling_in_three_states(&all),
        Query::Q4 => {
            let mut per: HashMap<u64, (u64, u64)> = HashMap::new();
            for c in reference_closed(&all) {
                let e = per.entry(c.category).or_default();
                e.0 += 1;
                e.1 += c.price;
            }
            per.into_iter().map(|(k, (n, sum))| (k, n, sum / n)).collect()
        }
        Query::Q5 => hot_items(&all),
        Query::Q6 => average_selling_price_by_seller(&all),
        Query::Q7 => highest_bid(bids()),
        Query::Q8 => new_people_selling(&all),
        Query::Q9 => reference_closed(&all).into_iter().map(|c| (c.auction, c.price, c.bidder)).collect(),
        Query::Q10 => bids().map(|b| (b.auction, b.bidder, b.price)).collect(),
        Query::Q11 => user_sessions(&all),
        Query::Q12 => {
            let mut per: HashMap<u64, u64> = HashMap::new();
            for b in bids() {
                *per.entry(b.bidder).or_default() += 1;
            }
            per.into_iter().map(|(k, n)| (k, n, 0)).collect()
        }
        Query::Q13 => bids().map(|b| (b.auction, b.price, side_input(b.auction))).collect(),
        Query::Q14 => bids()
            .filter_map(|b| {
                let euros = b.price * 908 / 1000;
                (1_000_000 < euros && euros < 50_000_000).then(|| {
                    let zeros = b.extra().with_str(|s| s.bytes().filter(|&c| c == b'0').count() as u64);
                    (b.auction, euros, time_of_day(b.date_time) << 32 | zeros)
                })
            })
            .collect(),
        Query::Q15 | Query::Q16 | Query::Q17 => bidding_statistics(&all, q),
        Query::Q18 => last_bid(prices()),
        Query::Q19 => auction_top_ten(&all),
        Query::Q20 => expand_bids(&all, bids()),
        Query::Q21 => bids().map(|b| (b.auction, b.price, channel_id(b))).collect(),
        Query::Q22 => bids().map(|b| (b.auction, b.price, url_dirs(b))).collect(),
    };
    rows.sort_unstable();
    rows
}

/// Q7: per window, the highest bid (then the smaller bidder).
fn highest_bid<'a>(bids: impl Iterator<Item = &'a Bid>) -> Vec<Row> {
    let mut best: HashMap<u64, (u64, u64)> = HashMap::new();
    for b in bids {
        let e = best.entry(window_start(b.date_time, WINDOW_MS)).or_insert((b.price, b.bidder));
        if (b.price, u64::MAX - b.bidder) > (e.0, u64::MAX - e.1) {
            *e = (b.price, b.bidder);
        }
    }
    best.into_iter().map(|(w, (p, bidder))| (w, p, bidder)).collect()
}

/// Q18: each bidder's last bid on each auction (latest time, then the highest price).
fn last_bid(prices: impl Iterator<Item = BidPrice>) -> Vec<Row> {
    let mut last: HashMap<(u64, u64), BidPrice> = HashMap::new();
    for b in prices {
        let e = last.entry((b.bidder, b.auction)).or_insert(b);
        if (b.date_time, b.price) >= (e.date_time, e.price) {
            *e = b;
        }
    }
    last.into_values().map(|b| (b.bidder, b.auction, b.price)).collect()
}

/// Q20: bids on auctions of category 10, with the auction's item.
fn expand_bids<'a>(all: &[Event], bids: impl Iterator<Item = &'a Bid>) -> Vec<Row> {
    let items: HashMap<u64, u64> = all
        .iter()
        .filter_map(|e| match e {
            Event::Auction(a) if a.category == 10 => Some((a.id, hash_key(&a.item_name()))),
            _ => None,
        })
        .collect();
    bids.filter_map(|b| items.get(&b.auction).map(|&item| (b.auction, b.price, item))).collect()
}

/// Q3: sellers in Oregon, Idaho or California of auctions in category 10.
fn people_selling_in_three_states(all: &[Event]) -> Vec<Row> {
    let people: HashMap<u64, u64> = all
        .iter()
        .filter_map(|e| match e {
            Event::Person(p) if p.state().with_str(|s| matches!(s, "OR" | "ID" | "CA")) => {
                Some((p.id, hash_key(&(p.name(), p.city(), p.state()))))
            }
            _ => None,
        })
        .collect();
    all.iter()
        .filter_map(|e| match e {
            Event::Auction(a) if a.category == 10 => people.get(&a.seller).map(|&who| (a.seller, a.id, who)),
            _ => None,
        })
        .collect()
}

/// Q5: per sliding window, the auction with the most bids.
fn hot_items(all: &[Event]) -> Vec<Row> {
    let bids = || all.iter().filter_map(bid_of);
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

/// Q6: per seller, closed auctions and the average of the last ten prices.
fn average_selling_price_by_seller(all: &[Event]) -> Vec<Row> {
    let mut per: HashMap<u64, (Vec<u64>, u64)> = HashMap::new();
    for c in reference_closed(all) {
        let e = per.entry(c.seller).or_default();
        e.0.push(c.price);
        e.1 += 1;
    }
    per.into_iter()
        .map(|(seller, (prices, n))| {
            let last = &prices[prices.len().saturating_sub(10)..];
            (seller, n, last.iter().sum::<u64>() / last.len() as u64)
        })
        .collect()
}

/// Q8: people who opened an auction in the window they registered in.
fn new_people_selling(all: &[Event]) -> Vec<Row> {
    let mut people: HashMap<(u64, u64), u64> = HashMap::new();
    for e in all {
        if let Event::Person(p) = e {
            *people.entry((p.id, window_start(p.date_time, WINDOW_MS))).or_default() += 1;
        }
    }
    let mut rows = Vec::new();
    for e in all {
        if let Event::Auction(a) = e {
            let w = window_start(a.date_time, WINDOW_MS);
            for _ in 0..people.get(&(a.seller, w)).copied().unwrap_or(0) {
                rows.push((a.seller, a.id, w));
            }
        }
    }
    rows
}

/// Q11: each bidder's sessions and their bids.
fn user_sessions(all: &[Event]) -> Vec<Row> {
    let bids = || all.iter().filter_map(bid_of);
    let mut times: HashMap<u64, Vec<u64>> = HashMap::new();
    for b in bids() {
        times.entry(b.bidder).or_default().push(b.date_time);
    }
    let mut rows = Vec::new();
    for (bidder, mut ts) in times {
        ts.sort_unstable();
        let (mut start, mut last, mut n) = (ts[0], ts[0], 0);
        for t in ts {
            if t >= last + WINDOW_MS {
                rows.push((bidder, start, n));
                (start, n) = (t, 0);
            }
            last = t;
            n += 1;
        }
        rows.push((bidder, start, n));
    }
    rows
}

/// Q15, Q16, Q17: bidding statistics per day, per channel and day, per auction and day.
fn bidding_statistics(all: &[Event], q: Query) -> Vec<Row> {
    let bids = || all.iter().filter_map(bid_of);
    let mut per: HashMap<(u64, u64), BidStats> = HashMap::new();
    for b in bids() {
        let key = match q {
            Query::Q15 => (b.date_time / DAY_MS, 0),
            Query::Q16 => (hash_key(&b.channel()), b.date_time / DAY_MS),
            _ => (b.auction, b.date_time / DAY_MS),
        };
        per.entry(key).or_default().add(&b.numbers());
    }
    per.into_iter()
        .map(|((a, b), s)| match q {
            Query::Q15 => (a, s.bids, s.digest()),
            Query::Q16 => (a, b, hash_key(&(s.bids, s.digest()))),
            _ => (a, b, hash_key(&(s.bids, s.min, s.max, s.sum / s.bids, s.sum))),
        })
        .collect()
}

/// Q19: each auction's ten best bids.
fn auction_top_ten(all: &[Event]) -> Vec<Row> {
    let prices = || all.iter().filter_map(bid_of).map(Bid::numbers);
    let mut per: HashMap<u64, Vec<BidPrice>> = HashMap::new();
    for b in prices() {
        per.entry(b.auction).or_default().push(b);
    }
    let mut rows = Vec::new();
    for (_, mut v) in per {
        v.sort_by(|a, b| if beats(a, b) { std::cmp::Ordering::Less } else { std::cmp::Ordering::Greater });
        rows.extend(v.into_iter().take(10).map(|b| (b.auction, b.price, b.bidder)));
    }
    rows
}

/// Reduces a job's output rows to the form [`reference`](fn@reference) gives (see each query's result),
/// sorted.
pub fn final_rows(q: Query, rows: Vec<Row>) -> Vec<Row> {
    let mut v: Vec<Row> = match q.final_form() {
        FinalForm::All => rows,
        FinalForm::BestPerWindow => {
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
            best.into_values().collect()
        }
        FinalForm::LastPerKey(columns) => {
            let mut last: HashMap<(u64, u64), Row> = HashMap::new();
            for r in rows {
                last.insert((r.0, if columns == 2 { r.1 } else { 0 }), r);
            }
            last.into_values().collect()
        }
        FinalForm::SumPerKey => {
            let mut sums: HashMap<u64, u64> = HashMap::new();
            for r in rows {
                *sums.entry(r.0).or_default() += r.1;
            }
            sums.into_iter().map(|(k, n)| (k, n, 0)).collect()
        }
    };
    v.sort_unstable();
    v
}
