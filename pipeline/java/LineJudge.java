/*
 * Silver's judge of one landing line on the JVM, for the line the lander writes from a
 * Ledge bridge's reading (pipeline.transforms.judge is the rule; this is a fast path).
 *
 * It judges only lines of exactly this shape, and returns null for every other line,
 * which the Python judge then judges:
 *
 *   {"topic":"<prefix>/<gateway>/<driver>/<device>/<quantity>","payload":"<payload>",
 *    "qos":1,"retain":false,"gateway":"<bridge>","seq":"<digits>","received":"<time>"}
 *
 * with no whitespace, no control character, no escape but \" (inside the payload), no
 * lone surrogate or replacement character (text that was not UTF-8); four valid topic
 * names, the last not "status"; a sequence number of 1 to 18 digits without a leading
 * zero; times of the form 2026-11-21T10:00:00[.123|.123456](Z|+01:00); and a payload of
 * the gateway's own shape (the Python judge's _CANONICAL, the same pattern). For such a
 * line json.loads, the contract and the Python judge give exactly what this returns (the
 * differential test runs both on generated lines): a reading, with no extra fields,
 * and for a reading beyond the late-data horizon the days it arrived after its
 * timestamp's day (silver quarantines it, with the Python judge's reason).
 *
 * Stateless: one instance may judge lines on several threads.
 */
package ledge.pipeline;

import java.time.DateTimeException;
import java.time.LocalDate;
import java.util.regex.Matcher;
import java.util.regex.Pattern;
import org.apache.spark.sql.Row;
import org.apache.spark.sql.RowFactory;
import org.apache.spark.sql.api.java.UDF5;

public final class LineJudge implements UDF5<String, String, Long, Long, Integer, Row> {
  private static final long serialVersionUID = 1L;
  private static final long DAY_US = 86_400_000_000L;
  private static final long NONE = Long.MIN_VALUE;
  /** pipeline.transforms.judge._CANONICAL, character for character. */
  private static final Pattern CANONICAL =
      Pattern.compile(
          "\\{\"value\":(?:(-?(?:0|[1-9][0-9]*))((?:\\.[0-9]+)?(?:[eE][-+]?[0-9]+)?)"
              + "|(true|false)|\"([^\"\\\\\\x00-\\x1f]*)\"),"
              + "\"unit\":\"([^\"\\\\\\x00-\\x1f]*)\",\"timestamp\":\"([^\"\\\\\\x00-\\x1f]*)\"\\}");

  private static final String TOPIC = "{\"topic\":\"";
  private static final String PAYLOAD = "\",\"payload\":\"";
  private static final String MARKS = "\",\"qos\":1,\"retain\":false,\"gateway\":\"";
  private static final String SEQ = "\",\"seq\":\"";
  private static final String RECEIVED = "\",\"received\":\"";
  private static final String END = "\"}";

  /**
   * The reading a line holds, or null (the Python judge decides): (topic, received, bridge,
   * seq, value, text, unit, timestamp, implausible, day, payload, late), times in
   * microseconds, the day in days since the epoch (UTC), and late null unless the reading
   * arrived more than horizon days after its timestamp's day: then those days.
   *
   * @param prefix the topic prefix (PipelineConfig.prefix)
   * @param tolerance how far ahead of the receive time a timestamp may be, microseconds
   * @param earliest the earliest plausible timestamp, microseconds since the epoch
   * @param horizon the late-data horizon in days
   */
  @Override
  public Row call(String line, String prefix, Long tolerance, Long earliest, Integer horizon) {
    if (line == null || prefix == null || tolerance == null || earliest == null
        || horizon == null) {
      return null;
    }
    return judge(line, prefix, tolerance, earliest, horizon);
  }

  static Row judge(String line, String prefix, long tolerance, long earliest, int horizon) {
    int n = line.length();
    for (int i = 0; i < n; i++) {
      char c = line.charAt(i);
      if (c < 0x20 || Character.isSurrogate(c) || c == '\uFFFD') {
        return null;
      }
    }
    Cursor at = new Cursor(line);
    String topic = at.expect(TOPIC) ? at.plain() : null;
    String payload = topic != null && at.expect(PAYLOAD) ? at.quoted() : null;
    String bridge = payload != null && at.expect(MARKS) ? at.plain() : null;
    String seqText = bridge != null && at.expect(SEQ) ? at.plain() : null;
    String receivedText = seqText != null && at.expect(RECEIVED) ? at.plain() : null;
    if (receivedText == null || !at.expect(END) || !at.done()) {
      return null;
    }
    long seq = sequence(seqText);
    long received = micros(receivedText);
    if (seq < 0 || received == NONE || !reading(topic, prefix)) {
      return null;
    }

    Matcher m = CANONICAL.matcher(payload);
    if (!m.matches()) {
      return null;
    }
    Double number;
    String text;
    if (m.group(1) != null) {
      number = number(m.group(1), m.group(2));
      if (number == null) {
        return null;
      }
      text = null;
    } else if (m.group(3) != null) {
      boolean yes = m.group(3).equals("true");
      number = yes ? 1.0 : 0.0;
      text = yes ? "true" : "false";
    } else {
      number = null;
      text = m.group(4);
    }
    long stamp = micros(m.group(6));
    if (stamp == NONE) {
      return null;
    }
    // pipeline.transforms.judge.Judge._when
    boolean implausible = stamp > received + tolerance || stamp < earliest;
    long day = Math.floorDiv(stamp, DAY_US);
    long after = Math.floorDiv(received, DAY_US) - day; // days after the timestamp's day
    Long late = null;
    if (implausible) {
      day = Math.floorDiv(received, DAY_US);
    } else if (after > horizon) {
      late = after;
    }
    return RowFactory.create(topic, received, bridge, seq, number, text, m.group(5), stamp,
        implausible, (int) day, payload, late);
  }

  /** The text of a JSON string at a cursor, as json.loads reads it, or null. */
  private static final class Cursor {
    private final String s;
    private int at;

    Cursor(String s) {
      this.s = s;
    }

    boolean expect(String literal) {
      if (!s.startsWith(literal, at)) {
        return false;
      }
      at += literal.length();
      return true;
    }

    boolean done() {
      return at == s.length();
    }

    /** Up to the next quote, with no escape in it; null when there is one. */
    String plain() {
      int end = s.indexOf('"', at);
      if (end < 0 || s.lastIndexOf('\\', end) >= at) {
        return null;
      }
      String out = s.substring(at, end);
      at = end;
      return out;
    }

    /** Up to the next unescaped quote, whose only escape is \" (read as a quote). */
    String quoted() {
      StringBuilder out = null;
      int start = at;
      for (int i = at; i < s.length(); i++) {
        char c = s.charAt(i);
        if (c == '"') {
          at = i;
          return out == null ? s.substring(start, i) : out.append(s, start, i).toString();
        }
        if (c == '\\') {
          if (i + 1 >= s.length() || s.charAt(i + 1) != '"') {
            return null;
          }
          if (out == null) {
            out = new StringBuilder(s.length());
          }
          out.append(s, start, i).append('"');
          start = ++i + 1;
        }
      }
      return null;
    }
  }

  /** A sequence number (judge._SEQ, and str(int(text)) == text), or -1. */
  static long sequence(String text) {
    int n = text.length();
    if (n < 1 || n > 18 || (n > 1 && text.charAt(0) == '0')) {
      return -1;
    }
    for (int i = 0; i < n; i++) {
      char c = text.charAt(i);
      if (c < '0' || c > '9') {
        return -1;
      }
    }
    return Long.parseLong(text);
  }

  /** A reading's topic whose four names are valid (judge.name_problem finds none). */
  static boolean reading(String topic, String prefix) {
    int p = prefix.length();
    if (!topic.startsWith(prefix) || topic.length() <= p || topic.charAt(p) != '/') {
      return false;
    }
    String[] levels = topic.substring(p + 1).split("/", -1);
    if (levels.length != 4 || levels[3].equals("status")) {
      return false;
    }
    for (String name : levels) {
      // judge._NAME: 1 to 128 characters, none of / + # NUL, not starting with $ (the
      // line holds no surrogate, so characters are code points)
      int n = name.length();
      if (n < 1 || n > 128 || name.charAt(0) == '$') {
        return false;
      }
      for (int i = 0; i < n; i++) {
        char c = name.charAt(i);
        if (c == '+' || c == '#' || c == 0) {
          return false;
        }
      }
    }
    return true;
  }

  /**
   * A number of the canonical pattern as the Python judge stores it: an integer through
   * int() then float() (at most 18 digits here: a long, rounded to the nearest double as
   * float() rounds), else float() of its text (both round correctly); null when it is not
   * finite or longer.
   */
  static Double number(String integer, String fraction) {
    if (fraction.isEmpty()) {
      int digits = integer.length() - (integer.charAt(0) == '-' ? 1 : 0);
      return digits > 18 ? null : (double) Long.parseLong(integer);
    }
    double value = Double.parseDouble(integer + fraction);
    return Double.isFinite(value) ? value : null;
  }

  private static int digits(String t, int from, int count) {
    int value = 0;
    for (int i = from; i < from + count; i++) {
      char c = t.charAt(i);
      if (c < '0' || c > '9') {
        return -1;
      }
      value = value * 10 + (c - '0');
    }
    return value;
  }

  /**
   * YYYY-MM-DDTHH:MM:SS, then .fff or .ffffff or nothing, then Z or +HH:MM or -HH:MM, as
   * microseconds since the epoch: what datetime.fromisoformat reads from it, in UTC. NONE
   * for any other text (the Python judge reads it), and for years 1 and 9999 (where the
   * offset may leave datetime's range).
   */
  static long micros(String t) {
    int n = t.length();
    if (n < 20 || t.charAt(4) != '-' || t.charAt(7) != '-' || t.charAt(10) != 'T'
        || t.charAt(13) != ':' || t.charAt(16) != ':') {
      return NONE;
    }
    int year = digits(t, 0, 4);
    int month = digits(t, 5, 2);
    int dayOfMonth = digits(t, 8, 2);
    int hour = digits(t, 11, 2);
    int minute = digits(t, 14, 2);
    int second = digits(t, 17, 2);
    if (year < 2 || year > 9998 || month < 1 || dayOfMonth < 1 || hour < 0 || hour > 23
        || minute < 0 || minute > 59 || second < 0 || second > 59) {
      return NONE;
    }
    int i = 19;
    long fraction = 0;
    if (t.charAt(i) == '.') {
      int count = 0;
      while (i + 1 + count < n && t.charAt(i + 1 + count) >= '0'
          && t.charAt(i + 1 + count) <= '9') {
        count++;
      }
      if (count == 3) {
        fraction = digits(t, i + 1, 3) * 1000L;
      } else if (count == 6) {
        fraction = digits(t, i + 1, 6);
      } else {
        return NONE;
      }
      i += 1 + count;
    }
    long offset;
    if (i == n - 1 && t.charAt(i) == 'Z') {
      offset = 0;
    } else if (i == n - 6 && (t.charAt(i) == '+' || t.charAt(i) == '-')
        && t.charAt(i + 3) == ':') {
      int hours = digits(t, i + 1, 2);
      int minutes = digits(t, i + 4, 2);
      if (hours < 0 || hours > 23 || minutes < 0 || minutes > 59) {
        return NONE;
      }
      offset = (hours * 3600L + minutes * 60L) * (t.charAt(i) == '-' ? -1 : 1);
    } else {
      return NONE;
    }
    long epochDay;
    try {
      epochDay = LocalDate.of(year, month, dayOfMonth).toEpochDay();
    } catch (DateTimeException e) { // 31 November, 29 February of a common year...
      return NONE;
    }
    long seconds = epochDay * 86_400L + hour * 3600L + minute * 60L + second - offset;
    return seconds * 1_000_000L + fraction;
  }
}
