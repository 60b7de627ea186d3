//! The keyed and two-input functions some queries need: closing auctions (q4, q6, q9),
//! local items (q3), expanded bids, seller averages, top bids, and the bid statistics of the
//! day-long queries.
//!
//! May touch: `weir` (keyed process and co-process functions, state).

use weir::record::hash_key;

use super::*;

/// Closes auctions: keyed by auction id, it keeps the auction and its best bid while it is
/// open, bids that came before their auction (from the other input) until it does, and emits
/// the winner when event time reaches the auction's end (a timer). Bids after the end lose.
#[derive(Clone)]
pub(super) struct CloseAuctions;

impl weir::operator::co_process::KeyedCoProcessFunction<u64, Auction, BidPrice> for CloseAuctions {
    type Out = Closed;
    /// The auction (id, category, seller, start, end) and the best bid so far; bids waiting
    /// for their auction.
    type State = (
        weir::state::KeyedValueState<u64, ((u64, u64, u64, u64), Option<BidPrice>)>,
        weir::state::ListState<u64, BidPrice>,
    );
    fn state(&self) -> Self::State {
        (weir::state::KeyedValueState::new(), weir::state::ListState::new())
    }
    fn process1(&mut self, a: Auction, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Closed>) {
        let (mut open, mut waiting) = ctx.state();
        let mut best: Option<BidPrice> = None;
        for b in waiting.take().into_iter().filter(|b| (a.date_time..=a.expires).contains(&b.date_time)) {
            if best.is_none_or(|x| beats(&b, &x)) {
                best = Some(b);
            }
        }
        open.set(((a.category, a.seller, a.date_time, a.expires), best));
        ctx.register_event_time_timer(a.expires);
    }
    fn process2(&mut self, b: BidPrice, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Closed>) {
        let (mut open, mut waiting) = ctx.state();
        match open.get().copied() {
            Some(((category, seller, start, end), best)) => {
                if (start..=end).contains(&b.date_time) && best.is_none_or(|x| beats(&b, &x)) {
                    open.set(((category, seller, start, end), Some(b)));
                }
            }
            None => waiting.add(b),
        }
    }
    fn on_timer(
        &mut self,
        _: u64,
        _: weir::state::TimeDomain,
        ctx: &mut weir::KeyedContext<'_, u64, Self::State, Closed>,
    ) {
        let auction = *ctx.key();
        let (mut open, _) = ctx.state();
        if let Some(((category, seller, _, expires), Some(b))) = open.clear() {
            ctx.emit(Closed { auction, category, seller, expires, price: b.price, bidder: b.bidder });
        }
    }
}

/// The closed auctions of `events` (q4, q6, q9).
pub(super) fn closed(events: Stream<Event>) -> Stream<Closed> {
    let auctions = auctions(events.clone()).key_by(|a: &Auction| a.id);
    let bids = bid_prices(events).key_by(|b: &BidPrice| b.auction);
    auctions.connect(bids).process(CloseAuctions).named("close-auctions")
}

/// q3's join: a person of OR, ID or CA kept by id; their category-10 auctions, before or
/// after the person arrives.
#[derive(Clone)]
pub(super) struct LocalItems;

impl weir::operator::co_process::KeyedCoProcessFunction<u64, Person, Auction> for LocalItems {
    type Out = Row;
    type State = (weir::state::KeyedValueState<u64, u64>, weir::state::ListState<u64, u64>);
    fn state(&self) -> Self::State {
        (weir::state::KeyedValueState::new(), weir::state::ListState::new())
    }
    fn process1(&mut self, p: Person, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let who = hash_key(&(p.name(), p.city(), p.state()));
        let (mut person, mut waiting) = ctx.state();
        person.set(who);
        let pending = waiting.take();
        for auction in pending {
            ctx.emit((p.id, auction, who));
        }
    }
    fn process2(&mut self, a: Auction, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let (person, mut waiting) = ctx.state();
        match person.get().copied() {
            Some(who) => ctx.emit((a.seller, a.id, who)),
            None => waiting.add(a.id),
        }
    }
}

/// q20's join: category-10 auctions by id, and the bids on them, in either order.
#[derive(Clone)]
pub(super) struct ExpandBids;

impl weir::operator::co_process::KeyedCoProcessFunction<u64, Auction, BidPrice> for ExpandBids {
    type Out = Row;
    /// The auction's item name (hashed), or the bids waiting for it.
    type State = (weir::state::KeyedValueState<u64, u64>, weir::state::ListState<u64, BidPrice>);
    fn state(&self) -> Self::State {
        (weir::state::KeyedValueState::new(), weir::state::ListState::new())
    }
    fn process1(&mut self, a: Auction, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let item = hash_key(&a.item_name());
        let (mut auction, mut waiting) = ctx.state();
        auction.set(item);
        for b in waiting.take() {
            ctx.emit((b.auction, b.price, item));
        }
    }
    fn process2(&mut self, b: BidPrice, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let (auction, mut waiting) = ctx.state();
        match auction.get().copied() {
            Some(item) => ctx.emit((b.auction, b.price, item)),
            None => waiting.add(b),
        }
    }
}

/// q6: per seller, the closed auctions in order of closing; the mean of the last ten.
#[derive(Clone)]
pub(super) struct SellerAverage;

impl weir::operator::process::KeyedProcessFunction<u64, Closed> for SellerAverage {
    type Out = Row;
    /// The last ten (expires, auction, price), oldest first, and how many closed in all.
    type State = weir::state::KeyedValueState<u64, (Vec<(u64, u64, u64)>, u64)>;
    fn state(&self) -> Self::State {
        weir::state::KeyedValueState::new()
    }
    fn process(&mut self, c: Closed, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let seller = *ctx.key();
        let mut s = ctx.state();
        let (last, total) = s.get_or_insert_with(|| (Vec::new(), 0));
        // Closings of one seller can arrive out of order (from several subtasks): keep them
        // sorted by (expires, auction), so the last ten do not depend on arrival.
        let at = last.partition_point(|x| (x.0, x.1) < (c.expires, c.auction));
        last.insert(at, (c.expires, c.auction, c.price));
        if last.len() > 10 {
            last.remove(0);
        }
        *total += 1;
        let mean = last.iter().map(|x| x.2).sum::<u64>() / last.len() as u64;
        let total = *total;
        ctx.emit((seller, total, mean));
    }
}

/// q19: per auction, the ten best bids, emitted when the input ends (an event-time timer at
/// the end of time).
#[derive(Clone)]
pub(super) struct TopBids;

impl weir::operator::process::KeyedProcessFunction<u64, BidPrice> for TopBids {
    type Out = Row;
    type State = weir::state::KeyedValueState<u64, Vec<BidPrice>>;
    fn state(&self) -> Self::State {
        weir::state::KeyedValueState::new()
    }
    fn process(&mut self, b: BidPrice, ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>) {
        let mut s = ctx.state();
        let top = s.get_or_insert_with(Vec::new);
        let at = top.partition_point(|x| beats(x, &b));
        if at < 10 {
            top.insert(at, b);
            top.truncate(10);
        }
        ctx.register_event_time_timer(u64::MAX);
    }
    fn on_timer(
        &mut self,
        _: u64,
        _: weir::state::TimeDomain,
        ctx: &mut weir::KeyedContext<'_, u64, Self::State, Row>,
    ) {
        let top = ctx.state().clear().unwrap_or_default();
        for b in top {
            ctx.emit((b.auction, b.price, b.bidder));
        }
    }
}

/// q13's side input: a fixed table of 10,000 entries, looked up by `auction % 10,000`.
pub(super) fn side_input(key: u64) -> u64 {
    hash_key(&format!("side-value-{}", key % 10_000))
}

/// q14: the time of day of a bid (0 day, 1 night, 2 other), by its hour.
pub(super) fn time_of_day(date_time: u64) -> u64 {
    match (date_time / 3_600_000) % 24 {
        8..=18 => 0,
        h if h >= 20 || h <= 6 => 1,
        _ => 2,
    }
}

/// q21: the channel id: fixed for the hot channels, else the URL's `channel_id` parameter.
pub(super) fn channel_id(b: &Bid) -> u64 {
    b.channel().with_str(|c| match c.to_ascii_lowercase().as_str() {
        "apple" => 0,
        "google" => 1,
        "facebook" => 2,
        "baidu" => 3,
        _ => b.url().with_str(|u| {
            u.split("channel_id=")
                .nth(1)
                .and_then(|v| v.split('&').next())
                .and_then(|v| v.parse().ok())
                .unwrap_or(u64::MAX)
        }),
    })
}

/// q22: the first three directories of the bid's URL, hashed.
pub(super) fn url_dirs(b: &Bid) -> u64 {
    b.url().with_str(|u| {
        let path = u.split("://").nth(1).unwrap_or(u);
        let mut dirs = path.split('/').skip(1);
        hash_key(&(dirs.next().unwrap_or(""), dirs.next().unwrap_or(""), dirs.next().unwrap_or("")))
    })
}

/// q15–q17's running statistics: count by price range (below $100, below $10,000, above),
/// distinct bidders and auctions, lowest, highest and total price.
#[derive(Clone, Debug, Default, PartialEq, Eq, weir::Persist)]
pub(crate) struct BidStats {
    pub(super) bids: u64,
    pub(super) ranks: [u64; 3],
    pub(super) bidders: Vec<u64>,
    pub(super) auctions: Vec<u64>,
    pub(super) min: u64,
    pub(super) max: u64,
    pub(super) sum: u64,
}

impl BidStats {
    pub(super) fn add(&mut self, b: &BidPrice) {
        self.bids += 1;
        self.ranks[if b.price < 10_000 {
            0
        } else if b.price < 1_000_000 {
            1
        } else {
            2
        }] += 1;
        for (set, v) in [(&mut self.bidders, b.bidder), (&mut self.auctions, b.auction)] {
            if let Err(at) = set.binary_search(&v) {
                set.insert(at, v);
            }
        }
        self.min = if self.bids == 1 { b.price } else { self.min.min(b.price) };
        self.max = self.max.max(b.price);
        self.sum += b.price;
    }
    /// Every statistic in one number (rows have three columns).
    pub(super) fn digest(&self) -> u64 {
        hash_key(&(self.ranks, self.bidders.len(), self.auctions.len(), self.min, self.max, self.sum))
    }
}
