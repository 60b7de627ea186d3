//! [`LineStream`]: lines of text, turned into records by a flat_map chained to the source.
//!
//! May touch: `operator`, `record`, `source`.

use crate::operator::stateless::FlatMap;
use crate::operator::Emitter;
use crate::record::Record;
use crate::source::TextBlocks;

use super::*;

impl LineStream {
    /// Turns each line into any number of records (chained to the source).
    pub fn flat_map<U: Record, F: Fn(&str, &mut Emitter<'_, U>) + Clone + Send + 'static>(self, f: F) -> Stream<U> {
        let source = self.source.clone();
        let lines =
            self.job.source_of(move |ctx| Ok(source.subtask(ctx.subtask, ctx.parallelism))).named_by_default("text");
        chained_op(&lines, "flat_map", move |_, next| {
            let f = f.clone();
            Ok(Box::new(FlatMap::new(move |line: String, e: &mut Emitter<'_, U>| f(&line, e), next)))
        })
    }

    /// Splits each line into lowercase [`crate::Word`]s (see [`crate::for_each_word`]). Words
    /// never span lines, so the source hands over blocks of whole lines as bytes: one
    /// allocation per block, and no separate UTF-8 check (the splitter reads invalid bytes
    /// as separators, as U+FFFD is).
    pub fn words(self) -> Stream<crate::Word> {
        let source = self.source.clone();
        let blocks = self
            .job
            .source_of(move |ctx| Ok(TextBlocks::new(source.subtask(ctx.subtask, ctx.parallelism))))
            .named_by_default("text");
        // Its records in are the blocks' lines, as the source counts them.
        chained_op_counting::<_, _, _, crate::pipeline::task::LinesInBlocks>(&blocks, "flat_map", move |_, next| {
            Ok(Box::new(FlatMap::new(
                |block: Vec<u8>, e: &mut Emitter<'_, crate::Word>| {
                    crate::record::for_each_word_in_bytes(&block, |w| e.emit(w))
                },
                next,
            )))
        })
        .named_by_default("words")
    }
}
